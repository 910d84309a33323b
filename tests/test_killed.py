"""A command killed from outside is reported KILLED, never ok: on the host backend (mode off),
where a killed process group reports -9, not a shell's 137."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.errors import ErrorCode
from tests.call_helpers import killed_mid_call

pytestmark = pytest.mark.anyio


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_host_command_killed_from_outside_is_killed_not_ok(make_config: Any, tmp_path: Any) -> None:
    config = make_config(f"agents: {{defaults: {{workspace: {tmp_path / 'ws'}, sandbox: {{mode: 'off'}}}}}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:victim")
        shell = await sess.shell()
        assert orch.journal is not None

        async def kill(call_id: str, _owner: str) -> None:
            await shell.kill(call_id, "KILL")  # what recovery or an operator does

        result = await killed_mid_call(sess, orch.journal, "echo started; sleep 60", kill)
    assert result is not None and not result.ok and result.error.code == ErrorCode.KILLED, result
    assert result.output["exit_code"] == -9 and "started" in result.output["output"]  # a process group, no shell


@pytest.mark.slow
async def test_a_cancelled_yield_call_takes_its_process_with_it(make_config: Any, tmp_path: Any) -> None:
    """exec with yield_ms whose caller goes away before the process id was returned: nobody could
    poll or kill that process, so the cancellation kills it (it used to run to its watchdog)."""
    import subprocess

    config = make_config(f"agents: {{defaults: {{workspace: {tmp_path / 'ws'}, sandbox: {{mode: 'off'}}}}}}")
    marker = "sleep 7717"

    def alive() -> bool:
        return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0

    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:yield")
        with anyio.move_on_after(1.5):
            await sess.call("exec", {"command": marker, "yield_ms": 60_000})
        with anyio.fail_after(10):
            while alive():
                await anyio.sleep(0.1)
        assert orch.journal is not None
        (last,) = [e for e in orch.journal.events(session="agent:main:yield") if e.stage == "abandoned"]
        assert "cancelled" in last.data["reason"]


@pytest.mark.slow
async def test_a_cancelled_call_cancels_its_pending_approval(make_config: Any, tmp_path: Any) -> None:
    """The caller of a call waiting for approval goes away: the approval is decided `cancelled`,
    so no approver can approve a call that will never run."""
    from sandbox.errors import SandboxError

    config = make_config(
        f"tools: {{approvals: {{require: [exec], timeout_s: 60}}}}\n"
        f"agents: {{defaults: {{workspace: {tmp_path / 'ws'}, sandbox: {{mode: 'off'}}}}}}"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:waiting")
        with anyio.move_on_after(1.0):
            await sess.call("exec", {"command": "echo never"})
        assert orch.journal is not None
        (approval,) = orch.journal.approvals(None)
        assert approval.status == "cancelled", approval
        assert orch.pending_approvals() == []
        with pytest.raises(SandboxError) as late:
            orch.approve(approval.id)
        assert late.value.code == ErrorCode.CONFLICT
