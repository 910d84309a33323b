"""Call handles in the library (`session.submit`, engine/handles.py): a submitted call runs in the
orchestrator's task, its handle reads its state (awaiting_approval while a human decides),
waits for its result, and cancels it (its command killed, the record naming who). Commands run
on the host (sandbox mode off); what is tested is the handle."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.config import load_config_text
from sandbox.errors import SandboxError

pytestmark = pytest.mark.anyio


def _config(tmp_path: Path, extra: str = "") -> Any:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return load_config_text(
        f"state_dir: '{tmp_path / 'state'}'\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}\n{extra}",
        base_dir=tmp_path,
    )


def _running(marker: str) -> list[int]:
    """Processes on this host whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return [pid for pid in found if pid != os.getpid()]


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_submitted_call_runs_on_its_own_and_its_handle_gets_the_result(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:h1")
        handle = await session.submit("exec", {"command": "sleep 0.5; echo done"})
        early = await handle.status()
        assert early is not None and early.state in ("queued", "running") and early.result is None
        result = await handle.result(timeout_s=30)
        assert result.ok and result.output["output"].strip() == "done" and result.call_id == handle.call_id
        again = await orch.call(handle.call_id).status()
        assert again is not None and again.state == "finished" and again.result == result
        assert again.session == session.key and again.tenant == "default"
        with pytest.raises(TimeoutError):
            await (await session.submit("exec", {"command": "sleep 5"})).result(timeout_s=0.2)


async def test_cancel_kills_the_command_and_says_who(tmp_path: Path) -> None:
    marker = "31.4159"
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:h2")
        handle = await session.submit("exec", {"command": f"sleep {marker}; touch late.txt"})
        with anyio.fail_after(10):
            while not _running(marker):
                await anyio.sleep(0.05)
        assert await handle.cancel(by="the test") is True
        found = await handle.status()
        assert found is not None and found.state == "abandoned" and found.reason == "cancelled by the test"
        assert (await handle.result()).error.code == "CONFLICT"
        assert await handle.cancel() is False  # it had ended
        assert _running(marker) == []
        assert orch.journal is not None
        assert "abandoned" in [e.stage for e in orch.journal.events(call_id=handle.call_id)]
    assert not (tmp_path / "ws" / "late.txt").exists()


@pytest.mark.parametrize("early", [False, True], ids=["running", "while-starting"])
async def test_cancel_leaves_nothing_of_a_command_that_ignores_term(tmp_path: Path, early: bool) -> None:
    """A cancelled durable call's command gets TERM, a grace period, then KILL, and the cancel's
    caller finds nothing left; also when the cancel lands while the start helper still runs (the
    process table has no entry yet: the KILL must still come)."""
    marker = "27.777" if early else "27.778"
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:term")
        handle = await session.submit("exec", {"command": f"trap '' TERM; sleep {marker}"})
        with anyio.fail_after(10):
            while not _running(marker if early else f"sleep {marker}"):
                await anyio.sleep(0.01 if early else 0.05)
        assert await handle.cancel(by="the test") is True
        assert (await handle.result()).error.code == "CONFLICT"
        assert _running(marker) == []


async def test_a_submitted_key_repeated_is_the_same_call(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:h3")
        command = {"command": "echo ran >> count.txt; wc -l < count.txt"}
        first = await session.submit("exec", command, idempotency_key="sub-1")
        second = await session.submit("exec", command, idempotency_key="sub-1")
        assert second.call_id == first.call_id
        assert (await first.result(timeout_s=30)).output["output"].strip() == "1"
        with pytest.raises(SandboxError) as refused:
            await session.submit("exec", {"command": "true"}, idempotency_key="sub-1")
        assert refused.value.code.value == "INVALID_ARGUMENTS" and refused.value.details["idempotency_key"] == "sub-1"
    assert (tmp_path / "ws" / "count.txt").read_text().count("ran") == 1


async def test_a_call_waiting_for_approval_says_so_and_runs_once_approved(tmp_path: Path) -> None:
    config = _config(tmp_path, "tools: {approvals: {require: [exec], timeout_s: 30}}")
    async with Orchestrator(config) as orch:
        handle = await orch.session(agent="a", key="agent:a:h4").submit("exec", {"command": "echo approved"})
        with anyio.fail_after(10):
            while not orch.pending_approvals():
                await anyio.sleep(0.02)
        found = await handle.status()
        assert found is not None and found.state == "awaiting_approval"
        orch.approve(orch.pending_approvals()[0].id, "fine")
        result = await handle.result(timeout_s=30)
        assert result.ok and result.output["output"].strip() == "approved"


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_closing_the_orchestrator_abandons_what_still_runs(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with Orchestrator(config) as orch:
        handle = await orch.session(agent="a", key="agent:a:h5").submit("exec", {"command": "sleep 27.1828"})
        await anyio.sleep(0.3)
    async with Orchestrator(config) as orch:
        found = await orch.call(handle.call_id).status()
        assert found is not None and found.state == "abandoned"
        assert await orch.call("c_no_such_call").status() is None
    assert _running("27.1828") == []


async def test_without_a_journal_there_are_no_handles(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path), journal=False) as orch:
        with pytest.raises(SandboxError, match="journal"):
            await orch.session(agent="a", key="agent:a:h6").submit("exec", {"command": "true"})
