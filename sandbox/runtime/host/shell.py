"""Mode `off`: the same Shell primitives on the host, for sessions that are not sandboxed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Unpack

import anyio

from sandbox.runtime import proc_kill, shellwrap
from sandbox.runtime.output import OutputCapture
from sandbox.runtime.protocol import ArgvOptions, ExecResult, RunRequest, argv_options

EXIT_POLL_S = 0.01  # without pidfds, how often an exit is looked for
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
                await self.kill(call_id, "KILL")  # confirmed: see kill
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
        """Signal everything `call_id` started (read from /proc: no shell, no fork per process);
        a KILL returns once none of it is left (bounded by KILL_CONFIRM_S)."""
        del user, pid_dir  # the host reads /proc: no pid file needed
        shellwrap.check_call_id(call_id)
        if signal not in shellwrap.SIGNALS:
            raise ValueError(f"bad signal {signal!r}")

        def kill_now() -> bool:
            members = proc_kill.members_of(proc_kill.all_pids(), call_id, skip_unreadable=True)
            proc_kill.signal_members(members, signal)
            return bool(members.pids)

        # a KILL waits (bounded) until none of it is left: a killed process takes a moment to
        # exit, and whoever killed it (a cancel, a durable call's stop) reads "killed" as "gone"
        deadline = time.monotonic() + KILL_CONFIRM_S
        while await anyio.to_thread.run_sync(kill_now) and signal == "KILL" and time.monotonic() < deadline:  # noqa: ASYNC110
            await anyio.sleep(0.01)  # processes on the host: no event to wait on

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
        # subprocess, not anyio.open_process: under uvloop a child also inherits copies of its
        # stdio sockets, so a detached job it starts (a durable call's command, its watchdog)
        # held our pipes open and this waited for their end. close_fds leaves it 0, 1 and 2.
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            process = subprocess.Popen(  # noqa: ASYNC220 - a fork and exec, as open_process does
                argv,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)

        async def pump(fd: int, which: int) -> None:
            os.set_blocking(fd, False)
            while True:
                await anyio.wait_readable(fd)
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return
                if not capture.add(which, chunk):
                    scope.cancel()  # over the output maximum: stop waiting; the caller kills
                    return
                if on_output is not None:
                    on_output(chunk)

        try:
            with anyio.move_on_after(timeout_s) as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump, out_r, 1)
                    tg.start_soon(pump, err_r, 2)
                await _exited(process)
            timed_out = scope.cancelled_caught and not capture.overflowed
            if scope.cancelled_caught and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        finally:
            if process.returncode is None:  # cancelled: nothing of it outlives the wait
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                with anyio.CancelScope(shield=True):
                    await _exited(process)
            for fd in (out_r, err_r):
                anyio.notify_closing(fd)
                os.close(fd)
        return ExecResult.from_capture(
            capture,
            exit_code=None if scope.cancelled_caught else process.returncode,
            duration_ms=(time.perf_counter() - start) * 1000,
            timed_out=timed_out,
        )


async def _exited(process: subprocess.Popen[bytes]) -> None:
    """Wait for `process` to exit, and reap it: on its pidfd where the kernel has them."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfds (an old kernel), or reaped already
        while process.poll() is None:  # noqa: ASYNC110 - nothing to wait on without a pidfd
            await anyio.sleep(EXIT_POLL_S)
        return
    try:
        while process.poll() is None:
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)
