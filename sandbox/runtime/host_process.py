"""One process on this host, its output captured, bounded in time, killed with its whole group:
what `mode: off` commands (runtime/host/shell.py) and host-run skills (runtime/skill_spec.py) run
through.

subprocess, not anyio.open_process: under uvloop a child also inherited copies of its stdio
sockets, so a detached job it started (a durable call's command, its watchdog) held our pipes
open, and the wait for their end lasted until the timeout. `close_fds` leaves the child its
stdin (`/dev/null`), stdout and stderr only, under any event loop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

import anyio

from sandbox.runtime.output import OutputCapture
from sandbox.runtime.protocol import ExecResult

EXIT_POLL_S = 0.01  # without pidfds (an old kernel), how often an exit is looked for


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    timeout_s: float | None,
    capture: OutputCapture | None = None,
    on_output: Callable[[bytes], None] | None = None,
) -> ExecResult:
    """Run `argv` (no shell) in a session of its own until it exits and its output ends, or
    `timeout_s` passes, or `capture` is full. Stopped by a timeout, a full capture or a cancelled
    caller, its whole process group is killed; a job it detached from its output and left
    running after a normal exit is its caller's to kill (by the call's tag, runtime/proc_kill)."""
    start = time.perf_counter()
    capture = capture or OutputCapture()
    out_r, out_w = os.pipe()
    try:
        err_r, err_w = os.pipe()
    except BaseException:
        os.close(out_r)
        os.close(out_w)
        raise
    try:
        process = subprocess.Popen(  # noqa: ASYNC220 - a fork and exec, as open_process does
            list(argv),
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
            await exited(process)
    finally:
        if process.returncode is None:  # timed out, overflowed or cancelled: its group goes
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with anyio.CancelScope(shield=True):
                await exited(process)
        for fd in (out_r, err_r):
            anyio.notify_closing(fd)
            os.close(fd)
    stopped = scope.cancelled_caught
    return ExecResult.from_capture(
        capture,
        exit_code=None if stopped else process.returncode,
        duration_ms=(time.perf_counter() - start) * 1000,
        timed_out=stopped and not capture.overflowed,
    )


async def exited(process: subprocess.Popen[bytes]) -> None:
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
