"""The narrow async protocol between tools and whatever runs them (Docker, the host, later k8s)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sandbox.runtime.output import Captured, OutputCapture
from sandbox.runtime.spec import SandboxSpec


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command. A non-zero exit code is data, not an exception."""

    exit_code: int | None  # None when the command was killed on timeout
    stdout: bytes
    stderr: bytes
    output: bytes  # stdout and stderr interleaved in arrival order
    duration_ms: float
    timed_out: bool = False
    # what was kept of each stream (0 interleaved, 1 stdout, 2 stderr) when some was cut
    kept: Mapping[int, Captured] = field(default_factory=dict)
    full_output_path: str | None = None  # host file with the whole output, when it outgrew memory
    overflowed: bool = False  # output passed the capture's max_bytes; the command was stopped
    notes: tuple[str, ...] = ()  # things the caller must be told (a kill not confirmed, ...)

    @classmethod
    def from_capture(
        cls, capture: OutputCapture, *, exit_code: int | None, duration_ms: float, timed_out: bool
    ) -> ExecResult:
        """The result of a command whose output went through `capture`."""
        capture.close()
        kept = {which: capture.stream(which) for which in (0, 1, 2)}
        notes = (capture.spill_error,) if capture.spill_error else ()
        return cls(
            exit_code=exit_code,
            stdout=capture.joined(1),
            stderr=capture.joined(2),
            output=capture.joined(0),
            duration_ms=duration_ms,
            timed_out=timed_out,
            kept={k: v for k, v in kept.items() if v.cut},
            full_output_path=str(capture.spill_path) if capture.spilled else None,
            overflowed=capture.overflowed,
            notes=notes,
        )


@dataclass(frozen=True)
class SandboxInfo:
    """One live sandbox as the engine reports it (from its labels and state)."""

    id: str
    name: str
    kind: str
    instance: str
    tenant: str
    agent: str
    scope: str
    scope_key: str
    session: str
    config_hash: str
    created_at: str
    status: str
    image: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        """Whether the container is running."""
        return self.status == "running"

    @classmethod
    def from_spec(cls, spec: SandboxSpec, *, created_at: str, status: str = "running") -> SandboxInfo:
        """What a backend that keeps its sandboxes in memory reports about one of them."""
        return cls(
            id=spec.name,
            name=spec.name,
            kind="exec",
            instance=spec.instance,
            tenant=spec.tenant,
            agent=spec.agent,
            scope=spec.scope,
            scope_key=spec.scope_key,
            session=spec.session if spec.scope == "session" else "",
            config_hash=spec.config_hash,
            created_at=created_at,
            status=status,
            image=spec.image,
        )


class Shell(Protocol):
    """Run commands in one sandbox (or on the host): all the tools need to run things."""

    @property
    def pid_dir(self) -> str:
        """Where pid files and background output live."""
        ...

    @property
    def tmp_dir(self) -> str | None:
        """A TMPDIR private to this shell's session, when it has one (a session user's); None
        lets the tools choose a per-session path."""
        ...

    async def run(
        self,
        command: str,
        *,
        call_id: str,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout_s: float | None = None,
        user: str | None = None,
        on_output: Callable[[bytes], None] | None = None,
        capture: OutputCapture | None = None,
        pid_dir: str | None = None,
    ) -> ExecResult:
        """Run `command` with /bin/sh -lc; on timeout (or cancellation) kill its whole process group.

        `pid_dir` overrides where its pid file goes (a session's private directory).

        `on_output` gets each chunk of output as it arrives (for progress events). `capture`
        bounds what is kept in memory and where the rest goes; when its maximum is passed the
        command is killed like on a timeout (`overflowed`). Without one, memory stays bounded
        and the middle of a long output is dropped.
        """
        ...

    async def run_argv(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run an argv directly (helpers, probes); no kill tracking. `env` adds to its environment."""
        ...

    async def kill(
        self, call_id: str, signal: str = "KILL", *, user: str | None = None, pid_dir: str | None = None
    ) -> None:
        """Signal every process a call started (its group and anything tagged with its id).

        `pid_dir`: where the call's pid file is (a session's private directory), when not the default.
        """
        ...


class Sandbox(Shell, Protocol):
    """A live sandbox: identity plus the primitives tools use."""

    @property
    def id(self) -> str:
        """The engine's id of the sandbox."""
        ...

    @property
    def spec(self) -> SandboxSpec:
        """The spec it was made from."""
        ...

    @property
    def gone(self) -> bool:
        """Whether the backend found it gone or stopped (it is replaced on next use)."""
        ...

    def set_reviver(self, revive: Callable[[], Awaitable[str]]) -> None:
        """How to get a fresh sandbox (its id) when this one is found gone before a command ran."""
        ...

    async def alive(self, call_id: str, *, user: str | None = None) -> list[int]:
        """Pids of processes a call started that are still alive."""
        ...


class Backend(Protocol):
    """Create, find and remove sandboxes. The engine and the manager know only this.

    Implementations: `sandbox.runtime.docker.backend.DockerBackend` (`runtime.backend: docker`,
    the default), `sandbox.runtime.host.backend.HostBackend` (`host`: no isolation, for
    development), and `sandbox.testing.FakeBackend` for tests of code built on the library.
    """

    name: str

    async def image_id(self, ref: str) -> str:
        """The id of the image a spec names (part of the drift hash); SandboxUnavailable if absent."""
        ...

    async def ensure(self, spec: SandboxSpec) -> Sandbox:
        """Return the sandbox for `spec`, creating or recreating it when needed."""
        ...

    async def exists(self, name: str) -> bool:
        """Whether a sandbox of this name exists now (running or not)."""
        ...

    async def list(self, *, instance: str | None) -> list[SandboxInfo]:
        """Sandboxes of one instance (None: every managed sandbox on the engine)."""
        ...

    async def remove(self, name_or_id: str) -> None:
        """Remove a sandbox and its anonymous volumes; missing is not an error."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
