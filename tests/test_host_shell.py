"""Commands on the host (runtime/host/shell.py, `mode: off`; host-run skills share its
runtime/host_process.py) under both event loops the service may run on: a command inherits no descriptor but its stdin, stdout and stderr, so a detached job
it starts never holds its output open; a killed call leaves nothing behind, even a command that
ignores TERM. uvloop's children kept copies of their stdio sockets: a durable call's start then
waited for its whole command, and failed past 30 s."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.runtime import proc_kill
from sandbox.runtime.host.shell import HostShell
from sandbox.runtime.protocol import RunRequest
from sandbox.runtime.skill_spec import run_on_host

pytestmark = pytest.mark.anyio


@pytest.fixture(
    params=[pytest.param(("asyncio", {}), id="asyncio"), pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")]
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def shell(tmp_path: Path) -> HostShell:
    return HostShell(tmp_path, tmp_path / "pids")


async def test_a_command_inherits_only_its_three_streams(tmp_path: Path) -> None:
    result = await shell(tmp_path).run_argv(["sh", "-c", "ls /proc/$$/fd"])
    assert result.exit_code == 0 and sorted(result.stdout.split()) == [b"0", b"1", b"2"], result.stdout


async def test_a_detached_job_does_not_hold_the_command_open(tmp_path: Path) -> None:
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(1000)}"
    try:
        result = await shell(tmp_path).run_argv(
            ["sh", "-c", f"sleep {marker} </dev/null >/dev/null 2>&1 & echo started"], timeout_s=5
        )
        assert not result.timed_out and result.exit_code == 0 and result.stdout == b"started\n", result
    finally:
        os.system(f"pkill -f 'sleep {marker}'")


async def test_a_kill_returns_once_a_term_ignoring_command_is_gone(tmp_path: Path) -> None:
    host = shell(tmp_path)
    call_id = f"c_{secrets.token_hex(6)}"

    async def run() -> None:
        await host.run(RunRequest(command="trap '' TERM; sleep 300", call_id=call_id, timeout_s=600))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(30):
            while not proc_kill.members_of(proc_kill.all_pids(), call_id, skip_unreadable=True).pids:
                await anyio.sleep(0.02)
        await host.kill(call_id, "TERM")  # ignored
        assert proc_kill.members_of(proc_kill.all_pids(), call_id, skip_unreadable=True).pids
        await host.kill(call_id, "KILL")
        assert not proc_kill.members_of(proc_kill.all_pids(), call_id, skip_unreadable=True).pids
        tg.cancel_scope.cancel()


async def test_a_host_skill_inherits_only_its_three_streams_too(tmp_path: Path) -> None:
    result = await run_on_host(["sh", "-c", "ls /proc/$$/fd"], {"PATH": "/usr/bin:/bin"}, str(tmp_path), 10)
    assert result.exit_code == 0 and sorted(result.stdout.split()) == [b"0", b"1", b"2"], result.stdout
