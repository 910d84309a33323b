"""Durable calls in the library (tools/handlers/durable.py, engine/handover.py), on the host
(sandbox mode off): a submitted exec runs as a background process whose input ends at once, that
is stopped past tools.exec.max_output_bytes, and whose record a waiter leaves for adoption while
its owner is freshly gone. The restarts themselves, with real services and sandboxes, are
tests/test_durable_restart_docker.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.config import load_config_text
from sandbox.engine.handover import Handover
from sandbox.journal.owners import current_owner
from sandbox.journal.store import Journal

pytestmark = pytest.mark.anyio


def _config(tmp_path: Path, extra: str = "") -> Any:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return load_config_text(
        f"state_dir: '{tmp_path / 'state'}'\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}\n{extra}",
        base_dir=tmp_path,
    )


async def test_a_durable_commands_input_is_at_its_end_at_once(tmp_path: Path) -> None:
    """`cat` reads nothing and ends, as in a plain exec: a durable call never waits for input."""
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:d1")
        handle = await session.submit("exec", {"command": "cat; read x || echo ended", "timeout_s": 20})
        result = await handle.result(timeout_s=15)
        assert result.ok, result.error
        assert result.output["output"] == "ended\n"
        assert "one stream" in result.output["note"]  # the merged output is said
    # its outcome is in the record: the log, status and pid files are gone, and the table entry
    left = [p.name for p in (tmp_path / "state").rglob("p_*") if p.is_file()]
    assert left == [], left
    tables = [json.loads(p.read_text()) for p in (tmp_path / "state").rglob("processes.json")]
    assert tables and all(t == {} for t in tables)


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_printing_past_the_output_limit_stops_a_durable_command(tmp_path: Path) -> None:
    config = _config(tmp_path, "tools: {exec: {max_output_bytes: 65536}}")
    async with Orchestrator(config) as orch:
        session = orch.session(agent="a", key="agent:a:d2")
        command = "yes durable | head -c 10000000; sleep 5; touch late.txt"
        handle = await session.submit("exec", {"command": command})
        result = await handle.result(timeout_s=30)
        assert not result.ok and result.error is not None and result.error.code == "QUOTA_EXCEEDED", result
        assert "max_output_bytes" in result.error.message
        # one that printed as much and ended before the first look is refused the same way
        fast = await (await session.submit("exec", {"command": "yes durable | head -c 10000000"})).result(timeout_s=30)
        assert fast.error is not None and fast.error.code == "QUOTA_EXCEEDED", fast
    assert not (tmp_path / "ws" / "late.txt").exists()  # stopped, not left to finish


def test_a_waiter_leaves_a_fresh_gone_owners_durable_call_for_adoption(tmp_path: Path) -> None:
    """Only a durable call awaits adoption, and only for a while after its owner went."""
    journal = Journal(tmp_path / "journal.sqlite3")
    gone = current_owner().rsplit("|", 2)[0] + "|999999|1"  # this host, a pid that is not this one's start
    try:
        for call_id, stage in (("c_plain", "running"), ("c_durable", "durable_started")):
            journal.append(
                trace_id="t",
                call_id=call_id,
                session="agent:a:s",
                tenant="default",
                agent="a",
                tool="exec",
                stage=stage,
                owner=gone,
            )
        journal.flush()
        # its last renewal, just before it died (a live owner renews every LEASE_S / 3)
        journal._write("INSERT INTO owners(owner, lease_until) VALUES (?, ?)", (gone, time.time() + 60))
        assert journal.call_alive("c_durable") is False
        assert journal.awaiting_adoption("c_durable") is True
        assert journal.awaiting_adoption("c_plain") is False
        journal._write("UPDATE owners SET lease_until = ?", (time.time() - 3600,))
        assert journal.awaiting_adoption("c_durable") is False  # gone an hour: not waited for any longer
    finally:
        journal.close()


def test_a_stopping_service_keeps_its_durable_calls_and_only_them() -> None:
    handover = Handover()
    handover.track("c_durable", True)
    assert not handover.kept("c_durable")  # not stopping: a cancel stops it
    handover.active = True
    assert handover.kept("c_durable") and not handover.kept("c_other")
    handover.track("c_durable", False)  # a kept call stays counted: the handover journals it
    assert handover.kept("c_durable")
