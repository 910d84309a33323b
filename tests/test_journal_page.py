"""Bounded reads of the journal: a page is newest first, walks by cursor, filters by tenant in the query."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sandbox.errors import SandboxError, UsageError
from sandbox.journal.store import Journal


def put(journal: Journal, n: int, *, tenant: str = "acme", session: str = "s", trace: str = "t") -> None:
    for i in range(n):
        journal.append(
            trace_id=trace,
            call_id=f"{tenant}-{session}-{i}",
            session=session,
            tenant=tenant,
            agent="a",
            tool="exec",
            stage="finished",
        )


def test_a_page_holds_limit_rows_newest_first(tmp_path: Path) -> None:
    """A page over 250 events holds `limit` of them, the newest first, and says where the next starts."""
    journal = Journal(tmp_path / "j.sqlite3")
    put(journal, 250)
    page = journal.page(tenant=None, limit=100)
    ids = [e.id for e in page.events]
    assert len(ids) == 100 and ids == sorted(ids, reverse=True) and ids[0] == 250
    assert page.next_cursor is not None
    journal.close()


def test_the_cursor_walks_every_event_once(tmp_path: Path) -> None:
    """Following next_cursor visits every event exactly once, newest to oldest, and ends with None."""
    journal = Journal(tmp_path / "j.sqlite3")
    put(journal, 257)
    seen: list[int] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = journal.page(tenant="acme", cursor=cursor, limit=50)
        seen += [e.id for e in page.events]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == list(range(257, 0, -1)) and pages == 6
    journal.close()


@pytest.mark.slow
def test_a_tenants_page_holds_its_own_events_whatever_a_neighbour_writes(tmp_path: Path) -> None:
    """1000 neighbour events written after 3 of a tenant's own: its page of 100 returns its 3."""
    journal = Journal(tmp_path / "j.sqlite3")
    put(journal, 3, tenant="quiet")
    put(journal, 1000, tenant="noisy")
    page = journal.page(tenant="quiet", limit=100)
    assert [e.tenant for e in page.events] == ["quiet"] * 3 and page.next_cursor is None
    assert len(journal.page(tenant="noisy", limit=100).events) == 100
    journal.close()


def test_session_trace_and_time_filters_are_exact(tmp_path: Path) -> None:
    """Session, trace, since and until each narrow the page to exactly the events that match."""
    journal = Journal(tmp_path / "j.sqlite3")
    put(journal, 5, session="one", trace="t1")
    put(journal, 7, session="two", trace="t2")
    assert len(journal.page(tenant="acme", session="one").events) == 5
    assert len(journal.page(tenant="acme", trace_id="t2").events) == 7
    assert journal.page(tenant="other", session="one").events == []
    every = journal.page(tenant=None).events
    middle = every[5].ts
    newer = journal.page(tenant=None, since=middle).events
    older = journal.page(tenant=None, until=middle).events
    assert all(e.ts >= middle for e in newer) and all(e.ts <= middle for e in older)
    assert {e.id for e in newer} | {e.id for e in older} == {e.id for e in every}
    assert journal.page(tenant=None, since=every[0].ts + 3600).events == []
    journal.close()


@pytest.mark.parametrize("cursor", ["", "e0", "e-1", "12", "e99999999999999999999", "x" * 500, "e1 OR 1=1"])
def test_a_bad_cursor_is_a_usage_error(tmp_path: Path, cursor: str) -> None:
    """A cursor the journal did not hand out is refused with a message that says what to pass."""
    journal = Journal(tmp_path / "j.sqlite3")
    with pytest.raises(UsageError, match="bad cursor"):
        journal.page(tenant=None, cursor=cursor)
    journal.close()


@pytest.mark.parametrize("limit", [0, -5, 10_001])
def test_a_bad_limit_is_a_usage_error(tmp_path: Path, limit: int) -> None:
    """A page of no rows, negative rows, or more than the maximum is refused."""
    journal = Journal(tmp_path / "j.sqlite3")
    with pytest.raises(UsageError, match="limit"):
        journal.page(tenant=None, limit=limit)
    journal.close()


def test_ping_reads_the_file_and_fails_clearly_when_it_is_damaged(tmp_path: Path) -> None:
    """ping() succeeds on a good journal, and on a file overwritten with junk raises a SandboxError naming it."""
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    journal.ping()
    journal.close()
    path.write_bytes(b"this is not a database" * 400)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with pytest.raises(SandboxError, match=str(path)):
        Journal(path).ping()


def test_an_old_journal_gets_the_new_indexes_in_place(tmp_path: Path) -> None:
    """A journal written before the tenant/time indexes is upgraded when opened, its events kept."""
    path = tmp_path / "j.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, trace_id TEXT NOT NULL, "
        "call_id TEXT NOT NULL, session TEXT NOT NULL, tenant TEXT NOT NULL, agent TEXT NOT NULL, "
        "tool TEXT NOT NULL, stage TEXT NOT NULL, duration_ms REAL, data TEXT NOT NULL DEFAULT '{}');"
        "INSERT INTO events(ts, trace_id, call_id, session, tenant, agent, tool, stage) "
        "VALUES (1.0, 't', 'c', 's', 'acme', 'a', 'exec', 'finished');"
    )
    old.close()
    journal = Journal(path)
    assert [e.call_id for e in journal.page(tenant="acme").events] == ["c"]
    journal.close()
    db = sqlite3.connect(path)
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"events_tenant", "events_ts"} <= names
    assert db.execute("PRAGMA user_version").fetchone()[0] >= 2
    db.close()
