"""`runtime.backend: host`: "sandboxes" that are host directories and host processes.

No isolation at all: a command runs as the orchestrator's user on the host, in the sandbox's
workspace directory (the same directory Docker would mount at /workspace). It exists so the
library runs where no engine does (development, CI without Docker) with the same scopes,
workspaces, policy and tools; `sandbox audit` reports it (SBX-P002 covers tools on the host).
Paths under /workspace in a command's working directory are translated to the host directory;
paths inside command text are not, so commands should use paths relative to the workspace.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

import anyio.to_thread

from sandbox.config.binds import CONTAINER_WORKDIR
from sandbox.runtime import proc_kill
from sandbox.runtime.folders import prepare_workspace
from sandbox.runtime.host.shell import HostShell
from sandbox.runtime.protocol import ArgvOptions, ExecResult, RunRequest, SandboxInfo
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.manager import SandboxManager


class HostSandbox:
    """One scope's workspace on the host, with a shell that runs there."""

    def __init__(self, spec: SandboxSpec, state_dir: Path) -> None:
        self._spec = spec
        self.workspace = Path(spec.workspace.source)  # a HostFolder: prepare_workspace refuses a volume
        self._shell = HostShell(self.workspace, state_dir / "host-sandboxes" / spec.name, env=spec.docker.env)
        self.gone = False
        self.created_at = datetime.now(UTC).isoformat(timespec="seconds")

    @property
    def id(self) -> str:
        """The sandbox's name (a host sandbox has no other id)."""
        return self._spec.name

    @property
    def spec(self) -> SandboxSpec:
        """The spec it was made from."""
        return self._spec

    @property
    def pid_dir(self) -> str:
        """Where pid files and background output live (in the state dir)."""
        return self._shell.pid_dir

    @property
    def tmp_dir(self) -> str | None:
        """None: the session's TMPDIR is the tools' choice."""
        return None

    @property
    def durable_processes(self) -> bool:
        """The host shell's answer."""
        return self._shell.durable_processes

    def set_reviver(self, revive: Callable[[], Awaitable[str]]) -> None:
        """Nothing to revive: a host directory does not die."""
        del revive

    def host_path(self, workdir: str | None) -> str | None:
        """A /workspace path as the host directory it stands for."""
        if workdir is None:
            return None
        if workdir == CONTAINER_WORKDIR or workdir.startswith(CONTAINER_WORKDIR + "/"):
            return str(self.workspace) + workdir[len(CONTAINER_WORKDIR) :]
        return workdir

    async def run(self, request: RunRequest) -> ExecResult:
        """Run `request.command` on the host in the workspace (see the Shell protocol)."""
        return await self._shell.run(dataclasses.replace(request, workdir=self.host_path(request.workdir)))

    async def run_argv(self, argv: Sequence[str], **options: Unpack[ArgvOptions]) -> ExecResult:
        """Run an argv on the host in the workspace (arguments that are /workspace paths translated)."""
        translated = [self.host_path(arg) or arg for arg in argv]
        return await self._shell.run_argv(translated, **options)

    async def kill(
        self, call_id: str, signal: str = "KILL", *, user: str | None = None, pid_dir: str | None = None
    ) -> None:
        """Signal everything `call_id` started."""
        await self._shell.kill(call_id, signal, user=user, pid_dir=pid_dir)

    async def end_user(self, user: str, *, remove: Sequence[str] = ()) -> bool:
        """Nothing to do: every command here runs as the orchestrator's own user, whatever
        session user it is given, so there is no uid of the session's to end (its `process`
        jobs are killed by the close itself)."""
        del user
        return True

    async def alive(self, call_id: str, *, user: str | None = None) -> list[int]:
        """Pids a call started that are still alive."""
        del user
        members = await anyio.to_thread.run_sync(
            lambda: proc_kill.members_of(proc_kill.all_pids(), call_id, skip_unreadable=True)
        )
        return list(members.pids)

    async def agent_link(self, user: str | None = None) -> None:
        """No resident agents here."""
        del user

    async def volume_folder(self) -> None:
        """No workspace volumes here."""

    def one_shot(self) -> None:
        """No one-shot sandboxes here."""


class HostBackend:
    """Sandboxes as host directories (see the module docstring: no isolation).

    Args:
        state_dir: where pid files and background output live.
    """

    name = "host"

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._sandboxes: dict[str, HostSandbox] = {}

    async def image_id(self, ref: str) -> str:
        """Host sandboxes have no image: the reference itself stands for it."""
        return f"host:{ref}"

    async def ensure(self, spec: SandboxSpec) -> HostSandbox:
        """The workspace made (no-follow, like Docker's) and a shell bound to it."""
        found = self._sandboxes.get(spec.name)
        if found is not None and found.spec.config_hash == spec.config_hash:
            return found
        await anyio.to_thread.run_sync(prepare_workspace, spec)
        sandbox = HostSandbox(spec, self.state_dir)
        self._sandboxes[spec.name] = sandbox
        return sandbox

    async def exists(self, name: str) -> bool:
        """Whether this process made a sandbox of this name."""
        return name in self._sandboxes

    async def list(self, *, instance: str | None, tenant: str | None = None) -> builtins.list[SandboxInfo]:
        """The sandboxes this process made (host sandboxes leave nothing to adopt)."""
        return [
            SandboxInfo.from_spec(box.spec, created_at=box.created_at)
            for box in self._sandboxes.values()
            if (instance is None or box.spec.instance == instance) and (tenant is None or box.spec.tenant == tenant)
        ]

    async def remove(self, name_or_id: str) -> None:
        """Forget a sandbox (its workspace stays, like a Docker bind's source)."""
        self._sandboxes.pop(name_or_id, None)

    async def aclose(self) -> None:
        """Nothing to release."""

    def browsers(self, instance: str) -> None:
        """No browser sandboxes here."""
        del instance

    def egress(self) -> None:
        """No egress proxies here."""

    def warm_pool(self, manager: SandboxManager) -> None:
        """No warm pool here."""
        del manager

    def freezer(self) -> None:
        """No pausing here."""

    async def facts(self, name_or_id: str) -> None:
        """No container to describe: a host sandbox is a folder and this process's shells."""
        del name_or_id
