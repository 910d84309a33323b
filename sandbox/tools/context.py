"""What a tool handler gets: the session's shell and files, its settings, and the call ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandbox.config.merge import EffectiveAgent
from sandbox.config.models import Config
from sandbox.fs.workspace import WorkspaceFiles
from sandbox.runtime.protocol import ExecResult


class ToolShell(Protocol):
    """The shell primitives the tools use (Docker sandbox or host)."""

    @property
    def pid_dir(self) -> str: ...

    async def run(
        self,
        command: str,
        *,
        call_id: str,
        env: Any = None,
        workdir: str | None = None,
        timeout_s: float | None = None,
        user: str | None = None,
    ) -> ExecResult: ...

    async def run_argv(self, argv: Any, *, user: str | None = None, timeout_s: float = 30.0) -> ExecResult: ...

    async def kill(self, call_id: str, signal: str = "KILL", *, user: str | None = None) -> None: ...


@dataclass
class ToolContext:
    """Everything one call of a built-in tool may use; tools never import docker."""

    call_id: str
    trace_id: str
    config: Config
    agent: EffectiveAgent
    session: str
    sandboxed: bool
    shell: ToolShell
    files: WorkspaceFiles
    workdir: str  # where commands start: /workspace in a sandbox, the workspace on the host
    state_dir: Path  # this session's state folder
