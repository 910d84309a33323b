"""Journal retention: by age and by size, in batches, never an open call's or a pending approval's events."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import anyio
import pytest

from sandbox.config import load_config_text
from sandbox.config.models import RetentionConfig
from sandbox.errors import ConfigError
from sandbox.journal.approvals import Approval
from sandbox.journal.retention import Retention, file_bytes, keep_journal_bounded
from sandbox.journal.store import Journal

DAY = 86400.0
BIG = {"output": "x" * 1500}  # about 1.5 KB per event: a few thousand events make megabytes


def put(journal: Journal, prefix: str, n: int, *, stage: str = "finished", data: dict[str, str] | None = None) -> None:
    for i in range(n):
        journal.append(
            trace_id=f"{prefix}-t",
            call_id=f"{prefix}-{i}",
            session="agent:a:s",
            tenant="acme",
            agent="a",
            tool="exec",
            stage=stage,
            data=data,
        )


def calls(journal: Journal) -> set[str]:
    found: set[str] = set()
    cursor: str | None = None
    while True:
        page = journal.page(tenant=None, cursor=cursor, limit=10_000)
        found |= {e.call_id for e in page.events}
        cursor = page.next_cursor
        if cursor is None:
            return found


def pending(call_id: str) -> Approval:
    return Approval("ap-1", call_id, "t", "agent:a:s", "a", "exec", {"command": "ls"}, "pending", "", time.time(), None)


def test_events_older_than_max_age_go_and_newer_ones_stay(tmp_path: Path) -> None:
    """With max_age 30d, events 31 days old are deleted and those of the last day are kept."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "old", 50)
    put(journal, "new", 20)
    newest_old = max(e.ts for e in journal.page(tenant=None, limit=1000).events if e.call_id.startswith("old"))
    oldest_new = min(e.ts for e in journal.page(tenant=None, limit=1000).events if e.call_id.startswith("new"))
    # the clock as it will be when exactly the "old" events are past 30 days
    now = (newest_old + oldest_new) / 2 + 30 * DAY
    report = journal.prune(Retention(30 * DAY, None), now=now)
    assert report.events_deleted == 50
    assert calls(journal) == {f"new-{i}" for i in range(20)}
    journal.close()


@pytest.mark.slow
def test_open_calls_and_pending_approvals_are_never_pruned(tmp_path: Path) -> None:
    """Calls still running (a live owner's lease) and calls waiting for approval keep their events at any age or size."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "running", 2, stage="running")  # open, owned by this live process
    put(journal, "waiting", 1, stage="approval_pending")
    journal.add_approval(pending("waiting-0"))
    put(journal, "done", 300, data=BIG)
    assert {c for c, _, _, alive in journal.open_calls() if alive} >= {"running-0", "running-1"}
    report = journal.prune(Retention(1.0, 1), now=time.time() + 365 * DAY)
    assert report.events_deleted == 300
    assert calls(journal) == {"running-0", "running-1", "waiting-0"}
    assert [a.id for a in journal.approvals("pending")] == ["ap-1"]
    journal.close()


@pytest.mark.slow
def test_a_size_bound_shrinks_the_file_below_it(tmp_path: Path) -> None:
    """A journal of megabytes pruned to a 512 KiB bound ends under it on disk (database and log), newest kept."""
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    put(journal, "e", 1200, data=BIG)
    assert file_bytes(path) > 2 * 1024 * 1024
    report = journal.prune(Retention(None, 512 * 1024))
    assert report.auto_vacuum == "incremental" and not report.vacuumed
    assert file_bytes(path) <= 512 * 1024 and report.bytes_after <= 512 * 1024
    kept = calls(journal)
    assert "e-1199" in kept and "e-0" not in kept and len(kept) > 50
    journal.close()


@pytest.mark.slow
def test_a_journal_from_before_retention_reuses_space_then_shrinks_after_one_vacuum(tmp_path: Path) -> None:
    """An auto_vacuum=NONE journal keeps its size after a prune (free pages reused); --vacuum converts and shrinks it."""
    path = tmp_path / "journal.sqlite3"
    db = sqlite3.connect(path)  # what the code before made: no auto_vacuum
    db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, trace_id TEXT NOT NULL, "
               "call_id TEXT NOT NULL, session TEXT NOT NULL, tenant TEXT NOT NULL, agent TEXT NOT NULL, "
               "tool TEXT NOT NULL, stage TEXT NOT NULL, duration_ms REAL, data TEXT NOT NULL DEFAULT '{}')")  # fmt: skip
    db.close()
    journal = Journal(path)
    bound = 512 * 1024
    put(journal, "e", 1200, data=BIG)
    report = journal.prune(Retention(None, bound))
    assert report.auto_vacuum == "none" and report.events_deleted > 0
    assert file_bytes(path) > bound  # the pages are free for reuse, the file is as large
    put(journal, "f", 100, data=BIG)
    grown = file_bytes(path)
    report = journal.prune(Retention(None, bound), vacuum=True)
    assert report.vacuumed and file_bytes(path) <= bound < grown
    put(journal, "g", 1200, data=BIG)
    report = journal.prune(Retention(None, bound))  # from now on without a VACUUM
    assert report.auto_vacuum == "incremental" and file_bytes(path) <= bound
    journal.close()


def test_decided_approvals_and_loop_rows_past_the_age_go_too(tmp_path: Path) -> None:
    """Old decided approvals and loop-detection rows are deleted with the events; a pending one stays."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "c", 3)
    journal.add_approval(pending("c-0"))
    journal.decide("ap-1", "approved")
    journal.loop_add("acme", "agent:a:s", "exec", "args", "result")
    journal.flush()
    report = journal.prune(Retention(DAY, None), now=time.time() + 2 * DAY)
    assert (report.events_deleted, report.approvals_deleted, report.loop_rows_deleted) == (3, 1, 1)
    assert journal.approvals(None) == [] and journal.loop_recent("acme", "agent:a:s", 10)[1] == []
    journal.close()


def test_a_tripped_breaker_lasts_max_age_not_for_good(tmp_path: Path) -> None:
    """A breaker (one row per tripped session, kept through a close) goes once it is older than
    max_age, and its session runs again; one tripped since stays tripped."""
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    for i in range(3):
        journal.loop_trip("acme", f"agent:a:old-{i}")
    journal.loop_reset("acme", "agent:a:reset")
    with sqlite3.connect(path) as db:  # tripped (and reset) two days ago
        db.execute("UPDATE loop_sessions SET ts = ts - ?", (2 * DAY,))
    journal.loop_trip("acme", "agent:a:new")
    report = journal.prune(Retention(DAY, None))
    assert report.loop_rows_deleted == 4
    assert not journal.loop_recent("acme", "agent:a:old-0", 10)[0]
    assert journal.loop_recent("acme", "agent:a:new", 10)[0]
    assert journal.prune(Retention(DAY, None)).loop_rows_deleted == 0
    journal.close()


def test_a_flood_of_events_does_not_untrip_a_breaker_early(tmp_path: Path) -> None:
    """The size bound deletes the oldest events, and with them loop history older than the oldest
    kept; a breaker goes by its age alone, so a tenant that floods the journal past max_bytes
    does not free its tripped session before max_age."""
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    journal.loop_trip("acme", "agent:a:s")
    with sqlite3.connect(path) as db:  # tripped an hour ago; the day's bound is far off
        db.execute("UPDATE loop_sessions SET ts = ts - 3600")
    put(journal, "flood", 1200, data=BIG)
    report = journal.prune(Retention(DAY, 512 * 1024))
    assert report.events_deleted > 0
    assert journal.loop_recent("acme", "agent:a:s", 10)[0]
    journal.close()


def test_a_breaker_tripped_by_a_process_of_the_version_before_counts_from_the_next_prune(tmp_path: Path) -> None:
    """Through an upgrade, a process of the version before (its journal opened before the new
    schema) trips breakers without a time (0). The next prune dates them now instead of
    deleting them as long past; max_age later they go."""
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    with sqlite3.connect(path) as db:  # the old statement: no ts
        db.execute("INSERT INTO loop_sessions(tenant, session, tripped) VALUES ('acme', 'agent:a:old', 1)")
    assert journal.prune(Retention(DAY, None)).loop_rows_deleted == 0
    assert journal.loop_recent("acme", "agent:a:old", 10)[0]
    assert journal.prune(Retention(DAY, None), now=time.time() + 2 * DAY).loop_rows_deleted == 1
    journal.close()


def test_breakers_of_a_journal_from_before_their_time_count_from_the_upgrade(tmp_path: Path) -> None:
    """A version-5 journal's breakers have no time: the upgrade gives them now, so the next prune
    keeps them (none is dropped because its time is unknown), and one past max_age from then goes."""
    path = tmp_path / "journal.sqlite3"
    Journal(path).close()
    db = sqlite3.connect(path)
    db.executescript(
        "DROP INDEX loop_sessions_ts; ALTER TABLE loop_sessions DROP COLUMN ts; "
        "INSERT INTO loop_sessions(tenant, session, tripped) VALUES ('acme', 'agent:a:s', 1); "
        "PRAGMA user_version = 5;"
    )
    db.close()
    journal = Journal(path)
    assert journal.loop_recent("acme", "agent:a:s", 10)[0]
    assert journal.prune(Retention(DAY, None), now=time.time() + DAY / 2).loop_rows_deleted == 0
    assert journal.loop_recent("acme", "agent:a:s", 10)[0]
    assert journal.prune(Retention(DAY, None), now=time.time() + 2 * DAY).loop_rows_deleted == 1
    journal.close()


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_service_task_prunes_periodically(tmp_path: Path) -> None:
    """keep_journal_bounded, run beside the service, deletes events once they pass max_age."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "c", 10)
    config = RetentionConfig(max_age="1s", max_bytes="0", check_every_s=0.2)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_journal_bounded, journal, config)
            while calls(journal):
                await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
    journal.close()


def test_retention_keys_parse_and_a_bad_value_names_its_key() -> None:
    """`2GiB` and `2g` are one size; `30x` and `lots` are refused naming journal.retention.<key>."""
    config = load_config_text("journal: {retention: {max_age: 12h, max_bytes: 2GiB}}", source="<t>", base_dir=Path("/"))
    assert Retention.of(config.journal.retention) == Retention(12 * 3600.0, 2 * 1024**3, 300.0)
    assert (
        Retention.of(load_config_text("{}", source="<t>", base_dir=Path("/")).journal.retention).max_age_s == 30 * DAY
    )
    for bad, key in (("max_age: 30x", "journal.retention.max_age"), ("max_bytes: lots", "journal.retention.max_bytes")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config_text(f"journal: {{retention: {{{bad}}}}}", source="<t>", base_dir=Path("/"))


def put_old(path: Path, n: int, *, days: float = 2.0, data: str = "{}") -> None:
    """`n` finished events `days` old, written straight into the file (append stamps them now)."""
    db = sqlite3.connect(path)
    ts = time.time() - days * DAY
    db.executemany(
        "INSERT INTO events(ts, trace_id, call_id, session, tenant, agent, tool, stage, data) "
        "VALUES (?, 't', ?, 'agent:a:s', 'acme', 'a', 'exec', 'finished', ?)",
        [(ts + i * 0.001, f"old-{i}", data) for i in range(n)],
    )
    db.commit()
    db.close()


def remaining(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    finally:
        db.close()


def test_a_prune_stops_at_the_batch_after_its_flag_is_set(tmp_path: Path) -> None:
    """3,500 events past the age, batches of 1,000: the flag set while the first batch runs ends the prune there."""
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    put_old(path, 3500)
    stop = threading.Event()

    def set_flag_in_first_batch(sql: str) -> None:  # traced on the write connection, in the prune's thread
        if sql.startswith("DELETE FROM events"):
            stop.set()

    journal._db.set_trace_callback(set_flag_in_first_batch)
    report = journal.prune(Retention(DAY, None), stop=stop)
    journal._db.set_trace_callback(None)
    assert report.stopped and report.events_deleted == 1000
    assert remaining(path) == 2500
    journal.close()


@pytest.mark.anyio
async def test_cancelling_the_service_task_ends_a_running_prune_within_one_batch(tmp_path: Path) -> None:
    """The service stopping (its task cancelled) while a prune runs in its thread: the task returns at once and
    the prune ends after the batch in flight (before, shutdown waited for the whole prune)."""
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    put_old(path, 3500)
    inside, release = threading.Event(), threading.Event()

    def hold_the_first_batch(sql: str) -> None:  # runs in the prune's thread, holding the write lock
        if sql.startswith("DELETE FROM events") and not inside.is_set():
            inside.set()
            release.wait(30)  # the test releases it once the task ended; the old code only gets past here

    journal._db.set_trace_callback(hold_the_first_batch)
    config = RetentionConfig(max_age="1d", max_bytes="0", check_every_s=3600)
    async with anyio.create_task_group() as tg:
        tg.start_soon(keep_journal_bounded, journal, config)
        await anyio.to_thread.run_sync(inside.wait)
        tg.cancel_scope.cancel()
    ended_first = not release.is_set()  # the task ended while its prune was still inside batch one
    release.set()
    journal.close()  # waits for the batch in flight (the write lock), never for the rest
    assert ended_first
    assert remaining(path) == 2500  # one batch of 1,000 deleted, the prune stopped there


@pytest.mark.slow
def test_the_write_lock_is_held_only_for_writes(tmp_path: Path) -> None:
    """A prune by age and size: on the write connection only writes (deletes, dating breakers that have
    no time, vacuum steps, the loop rows' tenant index the first size prune builds) run; the count of events,
    the sizes and the checkpoint use the prune's own connection (the writer never waits for them)."""
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    put_old(path, 1200, data='{"output": "' + "x" * 1500 + '"}')
    put(journal, "e", 1200, data=BIG)
    on_writer: list[str] = []
    journal._db.set_trace_callback(on_writer.append)
    report = journal.prune(Retention(DAY, 512 * 1024))
    journal._db.set_trace_callback(None)
    assert report.events_deleted > 1200 and not report.stopped
    assert on_writer, "the prune wrote nothing"
    writes = (
        "DELETE FROM ",
        "UPDATE loop_sessions SET ts = ",
        "PRAGMA incremental_vacuum",
        "CREATE INDEX IF NOT EXISTS",
    )
    others = [s for s in on_writer if not s.startswith(writes)]
    assert others == []
    assert file_bytes(path) <= 512 * 1024  # the checkpoint, from the other connection, still emptied the log
    journal.close()


def test_a_decided_approval_of_a_call_still_open_is_kept(tmp_path: Path) -> None:
    """An approved call that is still running keeps its approval past the age bound; a finished call's goes."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "running", 1, stage="running")
    put(journal, "done", 1)
    for approval_id, call_id in (("ap-running", "running-0"), ("ap-done", "done-0")):
        old = Approval(approval_id, call_id, "t", "agent:a:s", "a", "exec", {}, "pending", "", time.time(), None)
        journal.add_approval(old)
        journal.decide(approval_id, "approved")
    report = journal.prune(Retention(DAY, None), now=time.time() + 2 * DAY)
    assert report.approvals_deleted == 1
    assert [a.id for a in journal.approvals(None)] == ["ap-running"]
    journal.close()
