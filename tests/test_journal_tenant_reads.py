"""A tenant's page of one session or trace walks only that tenant's rows; the probe never waits for a page."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sandbox.journal.schema import SCHEMA_VERSION
from sandbox.journal.store import Journal


def put(journal: Journal, tenant: str, n: int, *, session: str = "main", trace: str = "t") -> None:
    for i in range(n):
        journal.append(
            trace_id=trace,
            call_id=f"{tenant}-{trace}-{i}",
            session=session,
            tenant=tenant,
            agent="a",
            tool="exec",
            stage="finished",
        )
    journal.flush()


def plan_of_page(journal: Journal, **filters: str) -> tuple[list[str], str]:
    """The call ids of the page and SQLite's plan for the statement that read it (traced, values bound)."""
    statements: list[str] = []
    journal._reader.set_trace_callback(statements.append)
    try:
        page = journal.page(limit=100, **filters)  # type: ignore[arg-type]
    finally:
        journal._reader.set_trace_callback(None)
    (select,) = [s for s in statements if s.startswith("SELECT * FROM events")]
    plan = " | ".join(str(r[3]) for r in journal._read(f"EXPLAIN QUERY PLAN {select}", ()))
    return [e.call_id for e in page.events], plan


def test_a_tenants_session_or_trace_page_walks_only_that_tenants_rows(tmp_path: Path) -> None:
    """Tenant `quiet` pages `session=main` (and its trace) beside a neighbour's 300 `main` rows written after:
    the statement walks (tenant, session) or (tenant, trace_id), so it never visits the neighbour's rows."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "quiet", 3)
    put(journal, "busy", 300)  # same session name, same trace id, newer: first on `events_session`
    ids, plan = plan_of_page(journal, tenant="quiet", session="main")
    assert ids == ["quiet-t-2", "quiet-t-1", "quiet-t-0"]
    assert "USING INDEX events_tenant_session (tenant=? AND session=?" in plan, plan
    assert "TEMP B-TREE" not in plan, plan  # in id order as walked: no sort of what it finds
    ids, plan = plan_of_page(journal, tenant="quiet", trace_id="t")
    assert len(ids) == 3
    assert "USING INDEX events_tenant_trace (tenant=? AND trace_id=?" in plan, plan
    ids, plan = plan_of_page(journal, tenant="quiet", session="main", trace_id="t")
    assert len(ids) == 3 and "events_tenant_trace (tenant=? AND trace_id=?" in plan, plan
    ids, plan = plan_of_page(journal, tenant="quiet")
    assert len(ids) == 3 and "events_tenant (tenant=?" in plan, plan
    journal.close()


def test_a_version_2_journal_gets_the_tenant_indexes_in_one_transaction(tmp_path: Path) -> None:
    """A journal left at schema version 2 (no composite indexes) is upgraded in place on open, its events kept."""
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    put(journal, "quiet", 2)
    journal.close()
    db = sqlite3.connect(path)
    db.executescript("DROP INDEX events_tenant_session; DROP INDEX events_tenant_trace; PRAGMA user_version = 2;")
    db.close()
    journal = Journal(path)
    ids, plan = plan_of_page(journal, tenant="quiet", session="main")
    assert ids == ["quiet-t-1", "quiet-t-0"] and "events_tenant_session" in plan, plan
    journal.close()
    db = sqlite3.connect(path)
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"events_tenant_session", "events_tenant_trace", "events_tenant", "events_ts"} <= names
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    db.close()


def test_ping_answers_while_a_page_holds_the_read_lock(tmp_path: Path) -> None:
    """The readiness probe has its own connection: with the read lock held by another thread (a long page),
    ping() still returns; before, it queued behind the page."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "quiet", 1)
    held, release = threading.Event(), threading.Event()

    def long_page() -> None:
        with journal._read_lock:
            held.set()
            release.wait(120)  # released by the test once it saw ping answer (or gave up)

    holder = threading.Thread(target=long_page)
    holder.start()
    assert held.wait(60)
    answered = threading.Event()

    def probe() -> None:
        journal.ping()
        answered.set()

    pinger = threading.Thread(target=probe)
    pinger.start()
    try:
        # not a time limit: the old ping never answers while the lock is held (it would after release)
        assert answered.wait(60), "ping() waited for the read lock a page holds"
        assert not release.is_set() and journal._read_lock.locked()
    finally:
        release.set()
        holder.join()
        pinger.join()
    journal.close()


def test_a_sessions_list_reads_only_the_newest_window_of_the_agents_events(tmp_path: Path) -> None:
    """sessions() groups the agent's newest `window` events, never its whole history (nor a neighbour's rows);
    session_calls() counts one session's own calls exactly."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "quiet", 3, session="s-old")
    put(journal, "quiet", 10, session="s-new", trace="u")
    put(journal, "busy", 50, session="s-new", trace="u")
    assert [(s, n) for s, _, n in journal.sessions("quiet", "a")] == [("s-new", 10), ("s-old", 3)]
    assert [(s, n) for s, _, n in journal.sessions("quiet", "a", window=10)] == [("s-new", 10)]
    assert journal.session_calls("quiet", "a", "s-new") == 10
    assert journal.session_calls("busy", "a", "s-new") == 50
    journal.close()


def test_a_journal_has_an_id_of_its_own_kept_across_opens_and_given_to_an_older_one(tmp_path: Path) -> None:
    """The id names the journal as the origin of the events it ships to a shared store: stable
    while the file lives, another for a journal made anew, and given to a journal of version 4."""
    journal = Journal(tmp_path / "j.sqlite3")
    first = journal.journal_id()
    journal.close()
    journal = Journal(tmp_path / "j.sqlite3")
    assert journal.journal_id() == first and len(first) == 32
    journal.close()
    db = sqlite3.connect(tmp_path / "j.sqlite3")
    db.executescript("DROP TABLE journal_meta; PRAGMA user_version = 4;")
    db.close()
    journal = Journal(tmp_path / "j.sqlite3")
    try:
        assert journal.journal_id() not in ("", first)
    finally:
        journal.close()
    other = Journal(tmp_path / "k.sqlite3")
    try:
        assert other.journal_id() != first
    finally:
        other.close()
