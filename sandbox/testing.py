"""What you need to test code built on this library, without Docker.

In the spirit of `structlog.testing` and httpx's `MockTransport`:

- :class:`FakeBackend` is a backend whose sandboxes run no command: each one goes to your
  handler, which returns the result (or raises), and every call is recorded. Workspaces are
  real directories (made like the Docker backend makes them), so the file tools work as
  they do in production.
- :func:`capture_logs` collects the library's structured log records (event name and bound
  fields) while a block runs.

    from sandbox import Orchestrator, load_config_text
    from sandbox.testing import FakeBackend, capture_logs, exec_result

    backend = FakeBackend(lambda call: exec_result(stdout=b"hello\\n"))
    async with Orchestrator(config, backend=backend) as orch:
        with capture_logs() as logs:
            result = await orch.session("agent:main:t").call("exec", {"command": "echo hello"})
    assert result.output["output"] == "hello\\n" and backend.calls[0].command == "echo hello"
    assert "tool_call_finished" in [r["event"] for r in logs]
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Unpack

import anyio.to_thread

from sandbox._log import logger
from sandbox.runtime.folders import prepare_workspace
from sandbox.runtime.protocol import ArgvOptions, ExecResult, RunRequest, SandboxInfo, argv_options
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.manager import SandboxManager

__all__ = ["FakeBackend", "FakeCall", "FakeSandbox", "capture_logs", "exec_result"]


@dataclass(frozen=True)
class FakeCall:
    """One command a fake sandbox was asked to run."""

    sandbox: str
    command: str | None  # the shell command (None for an argv)
    argv: tuple[str, ...]
    call_id: str | None
    env: Mapping[str, str]
    workdir: str | None
    timeout_s: float | None


def exec_result(
    *, exit_code: int | None = 0, stdout: bytes = b"", stderr: bytes = b"", timed_out: bool = False
) -> ExecResult:
    """An ExecResult as a command would produce it (stdout before stderr in `output`)."""
    return ExecResult(
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        output=stdout + stderr,
        duration_ms=0.0,
        timed_out=timed_out,
    )


Handler = Callable[[FakeCall], ExecResult | Awaitable[ExecResult]]


def _default_handler(call: FakeCall) -> ExecResult:
    del call
    return exec_result()


class FakeSandbox:
    """A sandbox whose commands go to the backend's handler."""

    def __init__(self, backend: FakeBackend, spec: SandboxSpec) -> None:
        self._backend = backend
        self._spec = spec
        self.gone = False
        self.killed: list[tuple[str, str]] = []  # (call id, signal)
        self.ended_users: list[str] = []  # users whose processes end_user killed

    @property
    def id(self) -> str:
        """The sandbox's name."""
        return self._spec.name

    @property
    def spec(self) -> SandboxSpec:
        """The spec it was made from."""
        return self._spec

    @property
    def pid_dir(self) -> str:
        """A path that exists nowhere (nothing runs)."""
        return "/fake/pids"

    @property
    def tmp_dir(self) -> str | None:
        """None: nothing runs."""
        return None

    @property
    def durable_processes(self) -> bool:
        """False: every command goes to the handler, keyed and submitted calls' too."""
        return False

    def set_reviver(self, revive: Callable[[], Awaitable[str]]) -> None:
        """Fake sandboxes never die."""
        del revive

    async def run(self, request: RunRequest) -> ExecResult:
        """Record the command and return what the handler says."""
        call = FakeCall(
            self.id, request.command, (), request.call_id, dict(request.env), request.workdir, request.timeout_s
        )
        result = await self._backend.handle(call)
        if request.on_output is not None and result.output:
            request.on_output(result.output)
        return result

    async def run_argv(self, argv: Sequence[str], **options: Unpack[ArgvOptions]) -> ExecResult:
        """Record the argv and return what the handler says."""
        _, timeout_s, env = argv_options(options)
        return await self._backend.handle(FakeCall(self.id, None, tuple(argv), None, dict(env or {}), None, timeout_s))

    async def kill(
        self, call_id: str, signal: str = "KILL", *, user: str | None = None, pid_dir: str | None = None
    ) -> None:
        """Record the kill."""
        del user, pid_dir
        self.killed.append((call_id, signal))

    async def end_user(self, user: str, *, remove: Sequence[str] = ()) -> bool:
        """Record it; nothing ever runs."""
        self.ended_users.append(user)
        return True

    async def alive(self, call_id: str, *, user: str | None = None) -> list[int]:
        """Nothing ever runs."""
        del call_id, user
        return []

    async def agent_link(self, user: str | None = None) -> None:
        """No resident agents here."""
        del user

    async def volume_folder(self) -> None:
        """No workspace volumes here."""

    def one_shot(self) -> None:
        """No one-shot sandboxes here."""


@dataclass
class FakeBackend:
    """A backend for tests: sandboxes made on request, commands answered by `handler`.

    Args:
        handler: gets each :class:`FakeCall` and returns an ExecResult (sync or async); raise
            a SandboxError from it to simulate a fault (SANDBOX_UNAVAILABLE, TIMEOUT, ...).
    """

    handler: Handler = _default_handler
    name: str = "fake"
    calls: list[FakeCall] = field(default_factory=list)
    sandboxes: dict[str, FakeSandbox] = field(default_factory=dict)

    async def handle(self, call: FakeCall) -> ExecResult:
        """Record a call and ask the handler."""
        self.calls.append(call)
        answer = self.handler(call)
        if isinstance(answer, ExecResult):
            return answer
        return await answer

    async def image_id(self, ref: str) -> str:
        """Any image exists."""
        return f"fake:{ref}"

    async def ensure(self, spec: SandboxSpec) -> FakeSandbox:
        """The sandbox for a spec; its workspace directory is made like Docker's would be."""
        found = self.sandboxes.get(spec.name)
        if found is not None and found.spec.config_hash == spec.config_hash:
            return found
        await anyio.to_thread.run_sync(prepare_workspace, spec)
        box = FakeSandbox(self, spec)
        self.sandboxes[spec.name] = box
        return box

    async def exists(self, name: str) -> bool:
        """Whether a sandbox of this name was made."""
        return name in self.sandboxes

    async def list(self, *, instance: str | None, tenant: str | None = None) -> builtins.list[SandboxInfo]:
        """The sandboxes made so far."""
        now = datetime.now(UTC).isoformat(timespec="seconds")
        return [
            SandboxInfo.from_spec(box.spec, created_at=now)
            for box in self.sandboxes.values()
            if (instance is None or box.spec.instance == instance) and (tenant is None or box.spec.tenant == tenant)
        ]

    async def remove(self, name_or_id: str) -> None:
        """Forget a sandbox."""
        self.sandboxes.pop(name_or_id, None)

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
        """No container to describe."""
        del name_or_id


@contextmanager
def capture_logs(level: str = "DEBUG") -> Iterator[list[dict[str, Any]]]:
    """Collect the library's log records while the block runs: `{"event", "level", **fields}`.

    The library is quiet by default (`logger.disable("sandbox")`); this enables it for the block
    and makes it quiet again afterwards.
    """
    records: list[dict[str, Any]] = []

    def sink(message: Any) -> None:
        record = message.record
        records.append({"event": record["message"], "level": record["level"].name, **record["extra"]})

    logger.enable("sandbox")
    sink_id = logger.add(sink, level=level, filter="sandbox")
    try:
        yield records
    finally:
        logger.remove(sink_id)
        logger.disable("sandbox")
