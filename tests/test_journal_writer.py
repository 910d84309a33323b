"""The journal's writer thread: queued writes, the commit barrier before a call runs, failures, close."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.errors import SandboxError
from sandbox.journal import writer as writer_module
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


async def test_a_barrier_with_nothing_else_writing_commits_on_its_own_thread(tmp_path: Path) -> None:
    """The usual case (one call, the writer idle): the barrier commits the queue itself, no thread hop."""
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    writer = journal._writer
    committed_on: list[str] = []
    transaction = writer._transaction

    def spy(batches: Any) -> None:
        committed_on.append(threading.current_thread().name)
        transaction(batches)

    writer._transaction = spy  # type: ignore[method-assign]
    try:
        for i in range(20):
            event(journal, f"c{i}", "proposed", commit=False)
            event(journal, f"c{i}", "running")
            await journal.commit(f"c{i}")
            assert stages_on_disk(path, f"c{i}") == ["proposed", "running"]
    finally:
        journal.close()
    here = threading.current_thread().name
    # the writer thread may win a race now and then; the barrier's own commit is the rule
    assert committed_on.count(here) >= 10, committed_on


async def test_another_process_holding_the_database_never_holds_the_event_loop(tmp_path: Path) -> None:
    """Another process's write lock: the barrier does not wait for it on the loop (busy timeout 0
    there); the thread writes the batch once the lock is gone, and the call's events are all kept."""
    path = tmp_path / "j.sqlite3"
    journal = Journal(path, busy_timeout_s=60)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        event(journal, "warm", "running")  # the schema exists and the writer thread runs
        await journal.commit("warm")
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction
        done = anyio.Event()

        async def call() -> None:
            event(journal, "c1", "proposed", commit=False)
            event(journal, "c1", "running")
            await journal.commit("c1")
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            started = anyio.current_time()
            await anyio.sleep(0.2)  # the loop runs other work while the lock is held
            held_for = anyio.current_time() - started
            assert not done.is_set()  # not written past the lock, and not failed either
            other.execute("COMMIT")
            with anyio.fail_after(30):
                await done.wait()
        assert held_for < 30  # the loop was not held for the busy timeout (60 s)
        assert stages_on_disk(path, "c1") == ["proposed", "running"]
    finally:
        other.close()
        journal.close()


async def test_the_thread_checkpoints_the_log_so_it_does_not_grow_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A barrier's own commit runs no checkpoint (one can take long, on the event loop's thread);
    the writer thread runs them, every CHECKPOINT_EVERY transactions, and every other write keeps
    SQLite's own (a prune's deletes must not grow the log past the database's size)."""
    monkeypatch.setattr(writer_module, "CHECKPOINT_EVERY", 10)
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    try:
        writer = journal._writer
        for i in range(60):
            journal.append(
                trace_id="t",
                call_id=f"c{i}",
                session="s",
                tenant="d",
                agent="a",
                tool="exec",
                stage="running",
                data={"pad": "p" * 3000},
            )
            await journal.commit(f"c{i}")
        with anyio.fail_after(30):
            while writer.checkpoints == 0:
                await anyio.sleep(0.01)
        assert journal._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == writer_module.AUTOCHECKPOINT_PAGES
    finally:
        journal.close()
    assert len(stages_on_disk(path)) == 60
