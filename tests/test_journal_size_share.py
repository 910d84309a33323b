"""The journal's size bound among tenants: a tenant that floods the journal loses its own oldest
history, never its neighbours' (journal/size_prune.py). Attacks on the real SQLite journal."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sandbox.journal.retention import Retention, file_bytes
from sandbox.journal.store import Journal

BIG = {"output": "x" * 1500}  # about 1.5 KB per event
BOUND = 512 * 1024


def put(journal: Journal, tenant: str, prefix: str, n: int, *, stage: str = "finished", data: object = None) -> None:
    for i in range(n):
        journal.append(
            trace_id=f"{prefix}-t",
            call_id=f"{prefix}-{i}",
            session=f"agent:a:{tenant}",
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


def test_a_cut_tenants_loop_history_older_than_what_it_keeps_goes_and_a_neighbours_stays(tmp_path: Path) -> None:
    """Loop-detection rows are bounded with the events: the cut tenant's rows older than its
    oldest kept event go (its calls of then are gone), though they are newer than the oldest event
    the journal keeps; the neighbour's, as old, stay."""
    journal = Journal(tmp_path / "journal.sqlite3")
    put(journal, "quiet", "q", 5)  # the oldest event kept: rows older than it went before
    journal.loop_add("quiet", "agent:a:quiet", "exec", "args", "early")
    journal.loop_add("noisy", "agent:a:noisy", "exec", "args", "early")  # newer than quiet's events
    put(journal, "noisy", "n", 1200, data=BIG)
    journal.loop_add("noisy", "agent:a:noisy", "exec", "args", "late")
    journal.flush()
    report = journal.prune(Retention(None, BOUND))
    assert report.loop_rows_deleted == 1
    assert [r[2] for r in journal.loop_recent("noisy", "agent:a:noisy", 10)[1]] == ["late"]
    assert [r[2] for r in journal.loop_recent("quiet", "agent:a:quiet", 10)[1]] == ["early"]
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
