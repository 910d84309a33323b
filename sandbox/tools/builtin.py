"""Specs of the built-in tools: names, descriptions, argument schemas. Handlers live elsewhere."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, ConfigDict, Field, field_validator

from sandbox.policy.sessions import SessionKeyArg
from sandbox.tools.spec import SIDE_EFFECTS, RetryPolicy, ToolArgs, ToolSpec


class ExecArgs(ToolArgs):
    command: str = Field(min_length=1, description="Shell command, run by /bin/sh -lc.")
    workdir: str | None = Field(None, description="Directory relative to the workspace.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    timeout_s: float | None = Field(None, gt=0, description="Kill the command after this long.")
    background: bool = Field(False, description="Start and return a process id at once.")
    yield_ms: int | None = Field(None, ge=0, description="Run up to this long, then background.")
    merge_output: bool = Field(True, description="Interleave stdout and stderr in order.")

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        # what execve can carry: a name before its `=`, no NUL anywhere (else the command could
        # not start, and the model would not learn why)
        for name, value in env.items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise ValueError(
                    f"an environment name must be non-empty, without '=' or NUL, its value without NUL: {name!r}"
                )
        return env


class ProcessArgs(ToolArgs):
    action: Literal["list", "poll", "log", "write", "kill"]
    id: str | None = Field(None, description="Process id returned by exec.")
    offset: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1)
    data: str | None = Field(None, description="Text to send to stdin (action write).")
    signal: Literal["TERM", "KILL", "INT", "HUP"] = "TERM"


class ReadArgs(ToolArgs):
    path: str = Field(min_length=1)
    offset: int = Field(0, ge=0, description="First line, 0-based.")
    limit: int | None = Field(None, ge=1, description="Number of lines.")
    line_numbers: bool = False


class WriteArgs(ToolArgs):
    path: str = Field(min_length=1)
    content: str


class EditArgs(ToolArgs):
    path: str = Field(min_length=1)
    old_string: str = Field(min_length=1)
    new_string: str
    replace_all: bool = False


class ApplyPatchArgs(ToolArgs):
    input: str = Field(min_length=1, description="The patch: *** Begin Patch format or unified diff.")


class BrowserArgs(ToolArgs):
    action: Literal["navigate", "screenshot", "click", "type", "evaluate", "content", "close"]
    url: str | None = None
    selector: str | None = None
    text: str | None = None
    script: str | None = None
    profile: str = Field("default", pattern=r"^[a-z0-9-]{1,64}$")


class CanvasArgs(ToolArgs):
    action: Literal["show", "hide", "update"]
    content: str | None = None


class WebFetchArgs(ToolArgs):
    url: str = Field(min_length=1)
    max_chars: int | None = Field(None, ge=1)


class WebSearchArgs(ToolArgs):
    query: str = Field(min_length=1)
    count: int = Field(5, ge=1, le=20)


class MemorySearchArgs(ToolArgs):
    query: str = Field(min_length=1, description="Words to look for in MEMORY.md and memory/**/*.md.")
    limit: int = Field(5, ge=1, le=50, description="Most results to return, best first.")


class MemoryGetArgs(ToolArgs):
    # `from` is a Python keyword: the field is from_, the model writes `from` (both accepted, so a
    # hook's rewrite of the dumped arguments validates again)
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    path: str = Field(min_length=1, description="MEMORY.md or a file under memory/ (e.g. memory/2026-01-05.md).")
    from_: int | None = Field(None, alias="from", ge=1, description="First line, 1-based.")
    lines: int | None = Field(None, ge=1, description="Number of lines.")


class SessionsListArgs(ToolArgs):
    limit: int = Field(20, ge=1, le=200, description="Most sessions to list.")


class SessionsHistoryArgs(ToolArgs):
    session: SessionKeyArg = Field(description="A session key from sessions_list or sessions_spawn.")
    limit: int = Field(20, ge=1, le=200, description="Most recent items (calls and messages) to return.")


class SessionsSendArgs(ToolArgs):
    session: SessionKeyArg = Field(description="A visible session's key.")
    text: str = Field(
        min_length=1,
        validation_alias=AliasChoices("text", "message"),
        description="The message (also accepted as `message`).",
    )


class SessionsSpawnArgs(ToolArgs):
    task: str = Field(min_length=1, description="What the sub-agent is to do (recorded with its lineage).")
    name: str | None = Field(None, description="Short name: the child's key ends in :subagent:<name>.")
    agent: str | None = Field(None, description="Another agent to run the child (tools.subagents.allow_agents).")
    tools: list[str] | None = Field(
        None, description="Narrow the child's tools to these names or groups; can only narrow."
    )


class SessionStatusArgs(ToolArgs):
    pass


class CronArgs(ToolArgs):
    action: Literal["list", "add", "remove"]
    schedule: str | None = None
    task: str | None = None
    id: str | None = None


class GatewayArgs(ToolArgs):
    action: Literal["status", "restart", "config"]


class MessageArgs(ToolArgs):
    channel: str = Field(min_length=1)
    to: str = Field(min_length=1)
    text: str = Field(min_length=1)


class NodesArgs(ToolArgs):
    action: Literal["list", "describe", "invoke"]
    node: str | None = None
    command: str | None = None


# Tools that change something are never retried automatically: running them twice is not safe.
# tools that change nothing: no stage of theirs must be durable before or after they run
_READS_ONLY = frozenset({"read", "memory_search", "memory_get", "sessions_list", "sessions_history", "session_status"})
_CHANGES_THINGS = frozenset(
    {
        "exec",
        "process",
        "write",
        "edit",
        "apply_patch",
        "browser",
        "canvas",
        "sessions_send",
        "sessions_spawn",
        "cron",
        "gateway",
        "message",
        "nodes",
    }
)


def _spec(
    name: str,
    description: str,
    params: type[ToolArgs],
    category: str,
    risk: str,
    timeout: float,
    sandboxed: bool,
) -> ToolSpec:
    retry = SIDE_EFFECTS if name in _CHANGES_THINGS else RetryPolicy()
    reads_only = name in _READS_ONLY
    return ToolSpec(name, description, params, category, risk, timeout, sandboxed, retry=retry, read_only=reads_only)  # type: ignore[arg-type]


BUILTIN_SPECS: tuple[ToolSpec, ...] = (
    _spec("exec", "Run a shell command in the workspace.", ExecArgs, "exec", "high", 60, True),
    _spec(
        "process",
        "Manage background processes started by exec.",
        ProcessArgs,
        "exec",
        "high",
        30,
        True,
    ),
    _spec("read", "Read a text file from the workspace.", ReadArgs, "file", "low", 30, True),
    _spec(
        "write",
        "Create or overwrite a file in the workspace.",
        WriteArgs,
        "file",
        "medium",
        30,
        True,
    ),
    _spec("edit", "Replace an exact string in a file.", EditArgs, "file", "medium", 30, True),
    _spec(
        "apply_patch",
        "Apply a multi-file patch, all or nothing.",
        ApplyPatchArgs,
        "file",
        "medium",
        60,
        True,
    ),
    _spec("browser", "Drive a headless browser over CDP.", BrowserArgs, "ui", "high", 120, True),
    _spec("canvas", "Show content on the user's canvas.", CanvasArgs, "ui", "low", 30, False),
    _spec(
        "web_fetch",
        "Fetch a URL and return its text.",
        WebFetchArgs,
        "network",
        "medium",
        60,
        True,  # curl in the session's sandbox, through its egress proxy
    ),
    _spec("web_search", "Search the web.", WebSearchArgs, "network", "low", 60, False),
    # read-only over workspace files (retried like read), so they run wherever the workspace is
    _spec(
        "memory_search",
        "Search the agent's memory files (MEMORY.md, memory/**/*.md); ranked snippets with line numbers.",
        MemorySearchArgs,
        "memory",
        "low",
        30,
        True,
    ),
    _spec(
        "memory_get",
        "Read lines of one memory file (MEMORY.md or memory/**/*.md).",
        MemoryGetArgs,
        "memory",
        "low",
        30,
        True,
    ),
    _spec(
        "sessions_list",
        "List sessions this agent can see.",
        SessionsListArgs,
        "session",
        "low",
        30,
        False,
    ),
    _spec(
        "sessions_history",
        "Read a session's history.",
        SessionsHistoryArgs,
        "session",
        "low",
        30,
        False,
    ),
    _spec(
        "sessions_send",
        "Send a message to another session.",
        SessionsSendArgs,
        "session",
        "medium",
        30,
        False,
    ),
    _spec(
        "sessions_spawn",
        "Spawn a sub-agent session.",
        SessionsSpawnArgs,
        "session",
        "medium",
        30,
        False,
    ),
    _spec(
        "session_status",
        "Status of the current session.",
        SessionStatusArgs,
        "session",
        "low",
        10,
        False,
    ),
    _spec("cron", "Manage scheduled tasks.", CronArgs, "automation", "high", 30, False),
    _spec("gateway", "Inspect or restart the gateway.", GatewayArgs, "automation", "high", 30, False),
    _spec("message", "Send a message on a channel.", MessageArgs, "messaging", "medium", 30, False),
    _spec("nodes", "Control paired device nodes.", NodesArgs, "automation", "high", 60, False),
)

BUILTIN_BY_NAME: dict[str, ToolSpec] = {spec.name: spec for spec in BUILTIN_SPECS}
