"""Tool names, groups, aliases and profiles: the vocabulary every policy list is written in."""

from __future__ import annotations

from collections.abc import Iterable

# Every built-in tool the policy can talk about. Handlers come from tools/; names live here so
# the config can be checked without importing any tool code.
BUILTIN_TOOLS: tuple[str, ...] = (
    "exec",
    "process",
    "read",
    "write",
    "edit",
    "apply_patch",
    "browser",
    "canvas",
    "web_fetch",
    "web_search",
    "memory_search",
    "memory_get",
    "sessions_list",
    "sessions_history",
    "sessions_send",
    "sessions_spawn",
    "session_status",
    "cron",
    "gateway",
    "message",
    "nodes",
)

GROUPS: dict[str, tuple[str, ...]] = {
    "group:fs": ("read", "write", "edit", "apply_patch"),
    "group:runtime": ("exec", "process"),
    "group:sessions": (
        "sessions_list",
        "sessions_history",
        "sessions_send",
        "sessions_spawn",
        "session_status",
    ),
    "group:memory": ("memory_search", "memory_get"),
    "group:web": ("web_search", "web_fetch"),
    "group:ui": ("browser", "canvas"),
    "group:automation": ("cron", "gateway"),
    "group:messaging": ("message",),
    "group:nodes": ("nodes",),
}

ALIASES: dict[str, str] = {"bash": "exec", "apply-patch": "apply_patch"}

# `write` names every tool that writes files: a rule that allows, denies or gates writing
# cannot be sidestepped through another spelling of a write (edit, apply_patch).
WRITES_FILES: tuple[str, ...] = ("edit", "apply_patch")

# Actions of a tool that act as another tool: `process write` sends input to a running command
# and `process kill` a signal, so they are part of running commands; a rule (policy deny or
# approval) on `exec` covers them. Reading a process (list, poll, log) is not.
ACTING_AS: dict[tuple[str, str], str] = {("process", "write"): "exec", ("process", "kill"): "exec"}


def acting_as(tool: str, params: dict[str, object]) -> str | None:
    """The tool whose rules also govern this call (`exec` for `process write|kill`), or None."""
    action = params.get("action")
    return ACTING_AS.get((tool, action)) if isinstance(action, str) else None


# Profiles are base allow lists (OpenClaw's tools.profile). `full` means no restriction.
PROFILES: dict[str, tuple[str, ...] | None] = {
    "minimal": ("session_status",),
    "coding": (
        "group:fs",
        "group:runtime",
        "group:sessions",
        "group:memory",
    ),
    "messaging": (
        "group:messaging",
        "sessions_list",
        "sessions_history",
        "sessions_send",
        "session_status",
    ),
    "full": None,
}

# What a sandboxed session gets when the config says nothing (DESIGN.md).
DEFAULT_SANDBOX_ALLOW: tuple[str, ...] = (
    "exec",
    "process",
    "read",
    "write",
    "edit",
    "apply_patch",
    "sessions_list",
    "sessions_history",
    "sessions_send",
    "sessions_spawn",
    "session_status",
)
DEFAULT_SANDBOX_DENY: tuple[str, ...] = (
    "browser",
    "canvas",
    "nodes",
    "cron",
    "gateway",
    "group:messaging",
)

# Sub-agents do not get these unless the sub-agent allow / also_allow names them: they could
# reconfigure the host, talk past their parent, or read the parent's status.
SUBAGENT_ALWAYS_DENY: tuple[str, ...] = ("gateway", "cron", "sessions_send", "session_status")
# At the maximum spawn depth a sub-agent is a leaf: it can neither spawn nor look around.
SUBAGENT_LEAF_DENY: tuple[str, ...] = ("sessions_spawn", "sessions_list", "sessions_history")


def normalize_name(name: str) -> str:
    """Lower-case a tool name or pattern and resolve aliases (`bash` -> `exec`)."""
    lowered = name.strip().lower()
    return ALIASES.get(lowered, lowered)


def _wildcard_match(pattern: str, name: str) -> bool:
    # Only `*` is special; fnmatch would also treat `[` and `?` as syntax.
    parts = pattern.split("*")
    if len(parts) == 1:
        return pattern == name
    if not name.startswith(parts[0]) or not name.endswith(parts[-1]):
        return False
    pos = len(parts[0])
    end = len(name) - len(parts[-1])
    for middle in parts[1:-1]:
        found = name.find(middle, pos, end)
        if found < 0:
            return False
        pos = found + len(middle)
    return pos <= end


def expand(pattern: str, universe: Iterable[str]) -> frozenset[str]:
    """Return the tools of `universe` that `pattern` names (group, wildcard, alias or name).

    `edit` and `apply_patch` follow `write`: a pattern that names `write` names them too.
    Unknown names expand to nothing here; the config loader rejects them before this runs.
    """
    name = normalize_name(pattern)
    known = frozenset(universe)
    if name in GROUPS:
        result = frozenset(GROUPS[name]) & known
    elif "*" in name:
        result = frozenset(t for t in known if _wildcard_match(name, t))
    else:
        result = frozenset({name}) & known
    if "write" in result:
        result |= frozenset(WRITES_FILES) & known
    return result


def explicitly_named(patterns: Iterable[str], universe: Iterable[str]) -> frozenset[str]:
    """The tools `patterns` name by name, alias or group; a wildcard names no tool explicitly.

    This is what lifts a tool from a default deny list: `allow: ["*"]` is not a decision about
    `gateway`, `allow: [gateway]` or `allow: [group:automation]` is.
    """
    known = tuple(universe)
    return expand_all((p for p in patterns if "*" not in p), known)


def expand_all(patterns: Iterable[str], universe: Iterable[str]) -> frozenset[str]:
    """Union of :func:`expand` over several patterns."""
    known = tuple(universe)
    out: set[str] = set()
    for pattern in patterns:
        out |= expand(pattern, known)
    return frozenset(out)


def _near(name: str, candidates: list[str], *, cutoff: float) -> list[str]:
    import difflib  # only a pattern that names nothing pays for it (every config load checks patterns)

    return difflib.get_close_matches(name, candidates, n=3, cutoff=cutoff)


def check_pattern(pattern: str, universe: Iterable[str]) -> str | None:
    """Return None when `pattern` names at least one known tool, else a message with near matches."""
    known = tuple(universe)
    name = normalize_name(pattern)
    if not name:
        return "an empty tool name"
    if name in GROUPS:
        return None
    if name.startswith("group:"):
        near = _near(name, list(GROUPS), cutoff=0.5)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        return f"unknown group {pattern!r}{hint} (groups: {', '.join(sorted(GROUPS))})"
    if "*" in name:
        if expand(name, known):
            return None
        return f"pattern {pattern!r} matches no known tool"
    if name in known:
        return None
    candidates = list(known) + list(ALIASES) + list(GROUPS)
    near = _near(name, candidates, cutoff=0.6)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return f"unknown tool {pattern!r}{hint}"
