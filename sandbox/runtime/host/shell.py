"""Mode `off`: the same Shell primitives on the host, for sessions that are not sandboxed."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Unpack

import anyio

from sandbox.runtime import proc_kill, shellwrap
from sandbox.runtime.host_process import run_process
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
        return await run_process(argv, env=env, cwd=str(cwd), timeout_s=timeout_s, capture=capture, on_output=on_output)
