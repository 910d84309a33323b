"""The journal's writer thread: queued writes, the commit barrier before a call runs, failures, close."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.errors import SandboxError
from sandbox.journal.store import Journal
from sandbox.tools import BUILTIN_SPECS
from sandbox.tools.registry import ToolRegistry

pytestmark = pytest.mark.anyio


def stages_on_disk(path: Path, call_id: str | None = None) -> list[str]:
    """What another connection (another process) reads: committed rows only."""
    db = sqlite3.connect(path)
    try:
        sql, args = "SELECT stage FROM events ORDER BY id", ()
        if call_id is not None:
            sql, args = "SELECT stage FROM events WHERE call_id = ? ORDER BY id", (call_id,)  # type: ignore[assignment]
        return [row[0] for row in db.execute(sql, args)]
    finally:
        db.close()


def event(journal: Journal, call_id: str, stage: str, commit: bool = True) -> None:
    journal.append(
        trace_id="t", call_id=call_id, session="s", tenant="d", agent="a", tool="exec", stage=stage, commit=commit
    )


async def test_append_is_queued_and_commit_makes_it_durable(tmp_path: Path) -> None:
    """Inside an event loop an event is queued (not written by append); `commit` returns once it is on disk."""
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    try:
        event(journal, "c1", "proposed", commit=False)
        event(journal, "c1", "running")
        await journal.commit("c1")
        assert stages_on_disk(path, "c1") == ["proposed", "running"]
    finally:
        journal.close()


def test_append_outside_an_event_loop_is_written_at_once(tmp_path: Path) -> None:
    """A synchronous caller (CLI, script) gets a plain synchronous write: on disk when append returns."""
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    event(journal, "c1", "finished")
    assert stages_on_disk(path) == ["finished"] and journal._writer._thread is None
    journal.close()


async def test_close_and_reads_write_what_is_queued(tmp_path: Path) -> None:
    """A read sees every event queued before it; close writes the rest; appending after close is INTERNAL."""
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    for i in range(200):
        event(journal, f"c{i}", "finished")
    assert len(journal.events()) == 200
    for i in range(200, 300):
        event(journal, f"c{i}", "finished")
    journal.close()
    assert len(stages_on_disk(path)) == 300
    with pytest.raises(SandboxError, match="cannot be written") as caught:
        event(journal, "late", "finished")
    assert caught.value.code.value == "INTERNAL"


async def test_a_failed_batch_fails_only_its_own_commit(tmp_path: Path) -> None:
    """A batch the database refuses raises INTERNAL at its call's barrier; other calls' events commit."""
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    try:
        journal._writer.submit("bad", (("INSERT INTO nowhere VALUES (?)", [(1,)]),))
        event(journal, "good", "running")
        await journal.commit("good")
        with pytest.raises(SandboxError, match="cannot be written") as caught:
            await journal.commit("bad")
        assert caught.value.code.value == "INTERNAL" and stages_on_disk(path) == ["running"]
        await journal.commit("bad")  # reported once
    finally:
        journal.close()


def registry(seen: list[list[str]], path: Path) -> ToolRegistry:
    reg = ToolRegistry((s, None) for s in BUILTIN_SPECS)

    @reg.tool(category="custom")
    async def probe(ctx: Any, n: int = 0) -> int:
        """Record what another process would read of this call right now."""
        seen.append(stages_on_disk(path, ctx.call_id))
        return n

    return reg


async def test_a_call_runs_only_after_its_stages_are_committed(make_config: Any, tmp_path: Path) -> None:
    """When the handler runs, the call's stages up to `running` are already on disk; `finished` is there when it returns."""
    config = make_config(
        f"tools: {{profile: full}}\nagents: {{defaults: {{sandbox: {{mode: 'off'}}}}, "
        f"list: [{{id: a, workspace: '{tmp_path / 'ws'}'}}]}}"
    )
    path = config.state_dir / "journal.sqlite3"
    seen: list[list[str]] = []
    async with Orchestrator(config, registry=registry(seen, path)) as orch:
        result = await orch.session("agent:a:main").call("probe", {"n": 1})
        assert result.ok
        assert seen == [["proposed", "policy_checked", "validated", "queued", "running"]]
        assert stages_on_disk(path, result.call_id)[-1] == "finished"


async def test_an_unwritable_journal_fails_the_call_before_it_runs(make_config: Any, tmp_path: Path) -> None:
    """The writer's connection broken under the orchestrator: the call is INTERNAL and its handler never runs."""
    config = make_config(
        f"tools: {{profile: full}}\nagents: {{defaults: {{sandbox: {{mode: 'off'}}}}, "
        f"list: [{{id: a, workspace: '{tmp_path / 'ws'}'}}]}}"
    )
    seen: list[list[str]] = []
    async with Orchestrator(config, registry=registry(seen, config.state_dir / "journal.sqlite3")) as orch:
        assert orch.journal is not None
        orch.journal._db.close()
        result = await orch.session("agent:a:main").call("probe", {"n": 1})
    assert result.error is not None and result.error.code == "INTERNAL" and "journal" in result.error.message
    assert seen == []


@pytest.mark.slow
async def test_concurrent_calls_share_commits_and_keep_every_event(make_config: Any, tmp_path: Path) -> None:
    """200 concurrent calls: every call's six stages are on disk in order, written in fewer transactions than calls."""
    config = make_config(
        f"tools: {{profile: full}}\nagents: {{defaults: {{sandbox: {{mode: 'off'}}}}, "
        f"list: [{{id: a, workspace: '{tmp_path / 'ws'}'}}]}}\n"
        "limits: {global_concurrency: 500, tenant_concurrency: 500, queue: {max_depth: 5000}}"
    )
    path = config.state_dir / "journal.sqlite3"
    seen: list[list[str]] = []
    async with Orchestrator(config, registry=registry(seen, path)) as orch:
        assert orch.journal is not None
        writer = orch.journal._writer
        results: list[Any] = []

        async def one(i: int) -> None:
            results.append(await orch.session(f"agent:a:p{i % 20}").call("probe", {"n": i}))

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(one, i)
        commits = writer.transactions
    assert all(r.ok for r in results) and len(results) == 200
    expected = ["proposed", "policy_checked", "validated", "queued", "running", "finished"]
    assert all(stages_on_disk(path, r.call_id) == expected for r in results)
    assert commits < 3 * 200  # three per call when each was its own transaction
