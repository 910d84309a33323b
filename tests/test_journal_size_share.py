"""The journal's size bound among tenants: a tenant that floods the journal loses its own oldest
history, never its neighbours' (journal/size_prune.py). Attacks on the real SQLite journal."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sandbox.journal.prune_steps import used_bytes
from sandbox.journal.retention import Retention, file_bytes
from sandbox.journal.store import Journal

BIG = {"output": "x" * 1500}  # about 1.5 KB per event
BOUND = 512 * 1024


def put(
    journal: Journal,
    tenant: str,
    prefix: str,
    n: int,
    *,
    stage: str = "finished",
    data: object = None,
    session: str = "",
) -> None:
    for i in range(n):
        journal.append(
            trace_id=f"{prefix}-t",
            call_id=f"{prefix}-{i}",
            session=session or f"agent:a:{tenant}",
            tenant=tenant,
            agent="a",
            tool="exec",
            stage=stage,
            data=data,  # type: ignore[arg-type]
        )


def kept(journal: Journal, tenant: str) -> set[str]:
    journal.flush()
    with sqlite3.connect(journal.path) as db:
        return {row[0] for row in db.execute("SELECT call_id FROM events WHERE tenant = ?", (tenant,))}


def weight(journal: Journal, tenant: str) -> int:
    with sqlite3.connect(journal.path) as db:
        return int(
            db.execute("SELECT SUM(length(CAST(data AS BLOB))) FROM events WHERE tenant = ?", (tenant,)).fetchone()[0]
        )


@pytest.mark.slow
def test_a_tenant_flooding_the_journal_pushes_out_its_own_history_not_an_earlier_neighbours(tmp_path: Path) -> None:
    """`quiet` wrote 40 calls first; `noisy` then writes megabytes. Over the bound, the oldest
    events are quiet's, yet quiet keeps every one: noisy gives up its own oldest, the journal
    ends under the bound, and noisy's newest are kept."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "quiet", "q", 40, data={"output": "y" * 200})
    put(journal, "noisy", "n", 1500, data=BIG)
    assert file_bytes(journal.path) > 3 * BOUND
    report = journal.prune(Retention(None, BOUND))
    assert kept(journal, "quiet") == {f"q-{i}" for i in range(40)}
    noisy = kept(journal, "noisy")
    assert "n-1499" in noisy and "n-0" not in noisy and len(noisy) > 50
    assert report.events_deleted == 1500 - len(noisy)
    assert file_bytes(journal.path) <= BOUND and report.bytes_after <= BOUND
    journal.close()


@pytest.mark.slow
def test_two_large_tenants_are_cut_to_the_same_weight_and_a_small_one_keeps_all(tmp_path: Path) -> None:
    """`a` holds twice what `b` holds; both are over the fair level, so both are cut to about
    the same weight (each its oldest first), and `c`, under it, loses nothing."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "c", "c", 30)
    put(journal, "a", "a", 800, data=BIG)
    put(journal, "b", "b", 400, data=BIG)
    journal.prune(Retention(None, BOUND))
    assert kept(journal, "c") == {f"c-{i}" for i in range(30)}
    a, b = kept(journal, "a"), kept(journal, "b")
    assert "a-0" not in a and "b-0" not in b and "a-799" in a and "b-399" in b
    assert abs(weight(journal, "a") - weight(journal, "b")) <= 0.15 * weight(journal, "b")
    journal.close()


@pytest.mark.slow
def test_a_flooding_tenant_keeps_its_open_calls_and_the_rest_comes_from_the_others(tmp_path: Path) -> None:
    """A tenant whose history is mostly calls still running cannot make the prune skip it: its
    open calls' events stay (as always), its finished ones go, and what it cannot give up is
    asked of the next largest tenant."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "noisy", "open", 150, stage="running", data=BIG)  # open, owned by this live process
    put(journal, "noisy", "done", 10, data=BIG)
    put(journal, "other", "o", 700, data=BIG)
    put(journal, "small", "s", 10)
    journal.prune(Retention(None, BOUND))
    noisy = kept(journal, "noisy")
    assert {f"open-{i}" for i in range(150)} <= noisy and not noisy & {f"done-{i}" for i in range(10)}
    assert kept(journal, "small") == {f"s-{i}" for i in range(10)}
    other = kept(journal, "other")
    assert "o-0" not in other and "o-699" in other
    # the first pass asked noisy for more than it could give; the next asked the others
    assert file_bytes(journal.path) <= BOUND
    journal.close()


def test_what_a_pinned_tenant_cannot_give_comes_from_the_next_largest_not_from_the_oldest(tmp_path: Path) -> None:
    """`small` wrote first, `noisy` holds calls still running, `big` wrote most and last. noisy is
    asked for more than it can give; the rest comes from big, the next largest, and small, whose
    events are the oldest deletable ones, keeps them all. The journal ends under its bound."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "small", "s", 20, data=BIG)
    put(journal, "noisy", "open", 80, stage="running", data=BIG)  # open, owned by this live process
    put(journal, "big", "b", 500, data=BIG)
    journal.prune(Retention(None, BOUND))
    assert kept(journal, "small") == {f"s-{i}" for i in range(20)}
    assert {f"open-{i}" for i in range(80)} <= kept(journal, "noisy")
    big = kept(journal, "big")
    assert "b-0" not in big and "b-499" in big and len(big) > 20
    assert file_bytes(journal.path) <= BOUND
    journal.close()


@pytest.mark.slow
def test_a_pinned_tenant_alone_over_the_level_does_not_end_the_prune(tmp_path: Path) -> None:
    """Only `noisy` is over the fair level, and all it holds is calls still running: it gives
    nothing, and the next pass asks the others (the bound is for the host's disk)."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "noisy", "open", 300, stage="running", data=BIG)
    put(journal, "other", "o", 100, data=BIG)
    journal.prune(Retention(None, BOUND))
    assert {f"open-{i}" for i in range(300)} <= kept(journal, "noisy")
    assert len(kept(journal, "other")) < 100
    journal.close()


@pytest.mark.slow
def test_call_records_a_tenant_keeps_count_in_its_weight(tmp_path: Path) -> None:
    """`hostile` holds keyed call records (a whole result each, kept for their 24 hours; no prune
    deletes them) beside a few events; `quiet` holds only events, more of them. hostile weighs
    its records too: it gives up every event it has before quiet gives up what is left to free."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "quiet", "q", 300, data=BIG)
    put(journal, "hostile", "h", 100, data=BIG)
    journal.flush()
    with sqlite3.connect(journal.path) as db:  # the rows CallRecords.end leaves (journal/calls.py)
        db.executemany(
            "INSERT INTO calls(call_id, tenant, session, agent, tool, idem_key, fingerprint, state, result, "
            "created, ended) VALUES (?, 'hostile', 'agent:a:hostile', 'a', 'exec', ?, 'f', 'finished', ?, 0, 0)",
            [(f"k-{i}", f"key-{i}", "r" * 50_000) for i in range(10)],
        )
    journal.prune(Retention(None, 1024 * 1024))
    assert kept(journal, "hostile") == set()
    assert len(kept(journal, "quiet")) > 100
    journal.close()


def per_row(tmp_path: Path, name: str, n: int, **row: object) -> float:
    """The pages in use per row of this shape, in a journal of its own (table and indexes)."""
    journal = Journal(tmp_path / f"{name}.sqlite3")
    put(journal, name, name, n, **row)  # type: ignore[arg-type]
    journal.flush()
    with sqlite3.connect(journal.path) as db:
        size = used_bytes(db)
    journal.close()
    return size / n


@pytest.mark.slow
def test_rows_shaped_to_waste_pages_weigh_what_they_take_on_disk(tmp_path: Path) -> None:
    """`hostile` writes rows of a bit over half a page (one row a page) under a 240-character
    session key; `quiet` writes ordinary ones. Both are over the fair level: each ends with about
    the same bytes on disk, not the same bytes of data."""
    hostile_row = {"data": {"output": "x" * 2040}, "session": "agent:a:" + "s" * 240}
    quiet_row = {"data": {"output": "y" * 300}}
    hostile_size = per_row(tmp_path, "hostile", 300, **hostile_row)
    quiet_size = per_row(tmp_path, "quiet", 1000, **quiet_row)
    assert hostile_size > 2 * (2040 + 400)  # what data and a fixed overhead would have said, far off
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "quiet", "q", 2000, **quiet_row)  # type: ignore[arg-type]
    put(journal, "hostile", "h", 700, **hostile_row)  # type: ignore[arg-type]
    journal.prune(Retention(None, 1024 * 1024))
    quiet, hostile = len(kept(journal, "quiet")) * quiet_size, len(kept(journal, "hostile")) * hostile_size
    assert 0 < quiet < 2000 * quiet_size and 0 < hostile < 700 * hostile_size  # both were cut
    assert abs(quiet - hostile) <= 0.25 * max(quiet, hostile), (quiet, hostile)
    journal.close()


def test_a_cut_tenants_loop_history_older_than_what_it_keeps_goes_and_a_neighbours_stays(tmp_path: Path) -> None:
    """Loop-detection rows are bounded with the events: the cut tenant's rows older than its
    oldest kept event go (its calls of then are gone), though they are newer than the oldest event
    the journal keeps; the neighbour's, older still, stay."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "quiet", "q", 5)  # the oldest event kept: rows older than it went before
    journal.loop_add("quiet", "agent:a:quiet", "exec", "args", "early")
    journal.loop_add("noisy", "agent:a:noisy", "exec", "args", "early")
    put(journal, "noisy", "n", 1200, data=BIG)
    journal.loop_add("noisy", "agent:a:noisy", "exec", "args", "recent")
    journal.loop_add("noisy", "agent:a:noisy", "exec", "args", "late")
    journal.flush()
    with sqlite3.connect(journal.path) as db:  # quiet's day was two days ago; noisy's early call one
        db.execute("UPDATE events SET ts = ts - 2 * 86400 WHERE tenant = 'quiet'")
        db.execute("UPDATE loop_calls SET ts = ts - 2 * 86400 WHERE tenant = 'quiet'")
        db.execute("UPDATE loop_calls SET ts = ts - 86400 WHERE tenant = 'noisy' AND result = 'early'")
        # five minutes before noisy's events: within the margin for events recorded out of order
        db.execute("UPDATE loop_calls SET ts = ts - 300 WHERE tenant = 'noisy' AND result = 'recent'")
    report = journal.prune(Retention(None, BOUND))
    assert report.loop_rows_deleted == 1
    assert [r[2] for r in journal.loop_recent("noisy", "agent:a:noisy", 10)[1]] == ["recent", "late"]
    assert [r[2] for r in journal.loop_recent("quiet", "agent:a:quiet", 10)[1]] == ["early"]
    with sqlite3.connect(journal.path) as db:  # found on the tenant's time index, built by the prune
        plan = " ".join(
            str(row[3])
            for row in db.execute(
                "EXPLAIN QUERY PLAN SELECT id FROM loop_calls WHERE tenant = ? AND ts < ? LIMIT 10", ("t", 1.0)
            )
        )
    assert "loop_calls_tenant_ts" in plan
    journal.close()


def test_a_tenant_that_keeps_no_event_keeps_its_loop_rows(tmp_path: Path) -> None:
    """A tenant whose every event went (another's pinned rows forced it) does not lose its loop
    window with them: only the journal-wide horizon (the oldest event kept) bounds those rows."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "noisy", "open", 150, stage="running", data=BIG)  # open: pinned, and the oldest kept
    put(journal, "quiet", "q", 20, data=BIG)
    journal.loop_add("quiet", "agent:a:quiet", "exec", "args", "mine")
    journal.flush()
    journal.prune(Retention(None, 128 * 1024))
    assert kept(journal, "quiet") == set()
    assert [r[2] for r in journal.loop_recent("quiet", "agent:a:quiet", 10)[1]] == ["mine"]
    journal.close()


def test_a_tenants_oldest_events_are_found_on_its_index_without_a_sort(tmp_path: Path) -> None:
    """Each batch reads the tenant's own rows in id order (the tenant index), however many the others hold."""
    from sandbox.journal.size_prune import DELETE_TENANT_OLDEST

    journal = Journal(tmp_path / "journal.sqlite3")
    journal.flush()
    with sqlite3.connect(journal.path) as db:
        select = DELETE_TENANT_OLDEST.split(" IN (", 1)[1].rsplit(") RETURNING", 1)[0]
        plan = " ".join(str(row[3]) for row in db.execute(f"EXPLAIN QUERY PLAN {select}", ("t", 10)))
    assert "events_tenant (tenant=?)" in plan and "TEMP B-TREE" not in plan
    journal.close()
