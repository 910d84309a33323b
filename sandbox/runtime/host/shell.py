"""Mode `off`: the same Shell primitives on the host, for sessions that are not sandboxed."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Unpack

import anyio
from anyio.abc import ByteReceiveStream

from sandbox.runtime import proc_kill, shellwrap
from sandbox.runtime.output import OutputCapture
from sandbox.runtime.protocol import ArgvOptions, ExecResult, RunRequest, argv_options

KILL_CONFIRM_S = 5.0  # how long a cancelled call waits for its killed processes to be gone


class HostShell:
    """Runs commands on the host in the agent's workspace, killable like the sandboxed ones.

    Args:
        workspace: the working directory for commands.
        pid_dir: where pid files and background output live.
        env: environment added to every command.
    """

    def __init__(self, workspace: Path, pid_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.workspace = workspace
        self._pid_dir = pid_dir
        self._env = dict(env or {})

    @property
    def pid_dir(self) -> str:
        """Where pid files and background output live."""
        return str(self._pid_dir)

    @property
    def tmp_dir(self) -> str | None:
        """None: on the host the session's TMPDIR is the tools' choice."""
        return None

    @property
    def durable_processes(self) -> bool:
        """True: a background process is in its own session, not a child that dies with this one."""
        return True

    async def run(self, request: RunRequest) -> ExecResult:
        """Run `request.command` with /bin/sh -lc; on timeout, overflow or cancellation kill its
        whole process group.

        `request.user` is not used: the host runs as the orchestrator's user.
        """
        call_id = request.call_id
        environment = {**os.environ, **self._env, **request.env, shellwrap.TAG_VAR: call_id}
        argv = shellwrap.wrapped_argv(request.command, call_id, request.pid_dir or self.pid_dir)
        try:
            result = await self._exec(
                argv, environment, request.workdir, request.timeout_s, request.on_output, request.capture
            )
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._kill_confirmed(call_id)
            raise
        if result.timed_out or result.overflowed:
            with anyio.CancelScope(shield=True):
                await self.kill(call_id, "TERM")
                await anyio.sleep(0.2)
                await self.kill(call_id, "KILL")
        return result

    async def run_argv(self, argv: Sequence[str], **options: Unpack[ArgvOptions]) -> ExecResult:
        """Run an argv directly (as this process's user: `user` has no meaning on the host)."""
        _, timeout_s, env = argv_options(options)
        return await self._exec(list(argv), {**os.environ, **self._env, **(env or {})}, None, timeout_s)

    async def kill(
        self, call_id: str, signal: str = "KILL", *, user: str | None = None, pid_dir: str | None = None
    ) -> None:
        """Signal everything `call_id` started (read from /proc: no shell, no fork per process)."""
        del user, pid_dir  # the host reads /proc: no pid file needed
        shellwrap.check_call_id(call_id)
        if signal not in shellwrap.SIGNALS:
            raise ValueError(f"bad signal {signal!r}")

        def kill_now() -> None:
            members = proc_kill.members_of(proc_kill.all_pids(), call_id, skip_unreadable=True)
            proc_kill.signal_members(members, signal)

        await anyio.to_thread.run_sync(kill_now)

    async def _kill_confirmed(self, call_id: str) -> None:
        """KILL everything `call_id` started and wait (bounded) until none of it is left: a killed
        process takes a moment to exit, and whoever cancelled the call reads "killed" as "gone"."""
        deadline = time.monotonic() + KILL_CONFIRM_S
        while True:
            await self.kill(call_id, "KILL")
            left = await anyio.to_thread.run_sync(
                lambda: proc_kill.members_of(proc_kill.all_pids(), call_id, skip_unreadable=True)
            )
            if not left.pids or time.monotonic() > deadline:
                return
            await anyio.sleep(0.01)

    async def _exec(
        self,
        argv: list[str],
        env: Mapping[str, str],
        workdir: str | None,
        timeout_s: float | None,
        on_output: Callable[[bytes], None] | None = None,
        capture: OutputCapture | None = None,
    ) -> ExecResult:
        self._pid_dir.mkdir(parents=True, exist_ok=True)
        cwd = Path(workdir) if workdir and workdir.startswith("/") else self.workspace / (workdir or "")
        start = time.perf_counter()
        capture = capture or OutputCapture()
        process = await anyio.open_process(argv, cwd=cwd, env=dict(env), start_new_session=True)

        async def pump(stream: ByteReceiveStream | None, which: int) -> None:
            if stream is None:
                return
            async for chunk in stream:
                if not capture.add(which, chunk):
                    scope.cancel()  # over the output maximum: stop waiting; the caller kills
                    return
                if on_output is not None:
                    on_output(chunk)

        async with process:
            with anyio.move_on_after(timeout_s) as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump, process.stdout, 1)
                    tg.start_soon(pump, process.stderr, 2)
                await process.wait()
            timed_out = scope.cancelled_caught and not capture.overflowed
            if scope.cancelled_caught and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        return ExecResult.from_capture(
            capture,
            exit_code=None if scope.cancelled_caught else process.returncode,
            duration_ms=(time.perf_counter() - start) * 1000,
            timed_out=timed_out,
        )
