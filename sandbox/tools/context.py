"""What a tool handler gets: the session's shell and files, its settings, and the call ids."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandbox.config.merge import EffectiveAgent
from sandbox.config.models import Config
from sandbox.fs.protocol import Files
from sandbox.runtime.protocol import Shell
from sandbox.tools.process_table import ProcessTable
from sandbox.tools.search import SearchProvider


def _no_progress(kind: str, **detail: object) -> None:
    del kind, detail


async def _no_note(stage: str, **data: object) -> None:
    del stage, data


def _never() -> bool:
    return False


def _ignore(running: bool) -> None:
    del running


async def _no_record(note: dict[str, Any]) -> None:
    del note


async def _no_publish(host_file: Path) -> str | None:
    return str(host_file)


class SessionsPort(Protocol):
    """The sessions tools' view of the orchestrator, bound to the calling session and call."""

    async def spawn(self, *, task: str, name: str | None, agent: str | None, tools: list[str] | None) -> dict[str, Any]:
        """Create a child session; return its key and what it sees."""
        ...

    async def list_sessions(self, *, limit: int) -> dict[str, Any]:
        """The sessions the caller may see, with status."""
        ...

    async def history(self, *, session: str, limit: int) -> dict[str, Any]:
        """Calls and messages of a visible session."""
        ...

    async def send(self, *, session: str, text: str) -> dict[str, Any]:
        """Append a message to a visible session's inbox."""
        ...

    async def status(self) -> dict[str, Any]:
        """The caller's sandbox, policy summary, limits and usage."""
        ...


class BrowserPort(Protocol):
    """The browser tool's view of the session's browser sandbox."""

    async def cdp_url(self) -> str:
        """Where the session's browser answers CDP (started, on its own network, if needed)."""
        ...


@dataclass
class ToolContext:
    """Everything one call of a built-in tool may use; tools never import docker."""

    call_id: str
    trace_id: str
    config: Config
    agent: EffectiveAgent
    session: str
    sandboxed: bool
    shell: Shell
    files: Files
    workdir: str  # where commands start: /workspace in a sandbox, the workspace on the host
    state_dir: Path  # this session's state folder
    emit: Callable[..., None] = _no_progress  # emit(kind, **detail): progress events for UIs
    # publish(host file) -> where the model finds a full output (the engine's spill rule)
    publish: Callable[[Path], Awaitable[str | None]] = _no_publish
    # the sessions tools (spawn, list, history, send, status); None without a journal
    sessions: SessionsPort | None = None
    # the session's process table (tools/process_table.py); None: the file in state_dir
    processes: ProcessTable | None = None
    # the session's browser sandbox; None where there is none (not sandboxed, not docker)
    browser: BrowserPort | None = None
    # the application's search provider (web_search); None when it gave none
    search: SearchProvider | None = None
    # await note(stage, **data): a stage of this call, on disk in the journal (a durable exec's process id)
    note: Callable[..., Awaitable[None]] = _no_note
    # the call has a record (an idempotency key, or submitted): its command outlives this process
    durable: bool = False
    # whether this call was handed over to the next orchestrator (engine/handover.py): its
    # command, cancelled here, is then left running, not killed
    handed_over: Callable[[], bool] = _never
    # durable_running(True/False): this call's durable command started, or its outcome is known
    durable_running: Callable[[bool], None] = _ignore
    # await record_durable(note): where its durable command runs, in the call's record (a shared
    # store's other replicas adopt it from there when this process is gone)
    record_durable: Callable[[dict[str, Any]], Awaitable[None]] = _no_record
