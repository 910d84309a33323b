"""The journal's size bound (`journal.retention.max_bytes`): the tenants that hold the most give
up their oldest events first, down to one level (journal/fair_share.py), so one tenant writing
fast pushes out its own history before its neighbours'.

A prune over the bound weighs every tenant's rows once, on the prune's own connection (no write
lock held; about 3 s per million events here): its events, each as SQLite lays it out
(journal/row_weight.py), and its call records
(a keyed call's whole result, kept for their 24 hours), which no prune deletes. It then deletes
each cut tenant's oldest events in short batches until it has given up its share. Events of open
calls and of calls waiting for approval are never deleted either. A tenant that cannot give up
its share (what it holds is pinned) gives up all it can; only what is still over the bound after
that is asked of the others, in a next pass: the bound holds, for the host's disk.

Then each cut tenant's loop-detection rows older than the oldest event it keeps go (its calls of
then are gone), found on a (tenant, ts) index the first such prune builds (under the write
lock: 0.67 s at a million loop rows, measured by a reviewer; once per journal). A tenant that keeps
no event loses none of its loop rows here: the journal-wide horizon (rows older than the oldest
event kept, journal/retention.py) bounds them, as before.
"""

from __future__ import annotations

import functools
import math
import sqlite3
from dataclasses import dataclass

from sandbox.journal.fair_share import fair_cuts
from sandbox.journal.prune_steps import BATCH_ROWS, PruneJob, pragma, used_bytes
from sandbox.journal.row_weight import (
    CALL_INDEX_KEYS,
    CALL_INDEXES,
    CALL_PAYLOAD,
    FUNCTION,
    INDEX_KEYS,
    INDEXES,
    PAYLOAD,
    register,
    row_weight,
)

MAX_PASSES = 4  # a pass that frees too little (pages an index frees late) is followed by another
OUT_OF_ORDER_S = 600.0  # how far an event's time may trail a later id's (buffered stages, egress notes)
# fixed words only (the weight's SQL is this project's, no input)
EVENT_USAGE = (
    f"SELECT tenant, COUNT(*), COALESCE(SUM({FUNCTION}({PAYLOAD}, {INDEX_KEYS}, {INDEXES})), 0) "  # noqa: S608
    "FROM events GROUP BY tenant"
)
# call records: every column of each and its three index entries, weighed as events are
PINNED_USAGE = (
    f"SELECT tenant, COALESCE(SUM({FUNCTION}({CALL_PAYLOAD}, {CALL_INDEX_KEYS}, {CALL_INDEXES})), 0) "  # noqa: S608
    "FROM calls GROUP BY tenant"
)
# a tenant's oldest events that no open call and no pending approval needs, on the tenant index
# (in id order within a tenant: no sort); what each weighs comes back
DELETE_TENANT_OLDEST = (
    "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE tenant = ? "  # noqa: S608 - fixed words
    "AND call_id NOT IN (SELECT call_id FROM open_calls) "
    "AND call_id NOT IN (SELECT call_id FROM approvals WHERE status = 'pending') "
    f"ORDER BY id LIMIT ?) RETURNING {PAYLOAD}, {INDEX_KEYS}"
)
OLDEST_KEPT = "SELECT ts FROM events WHERE tenant = ? ORDER BY id LIMIT 1"
LOOP_INDEX = "CREATE INDEX IF NOT EXISTS loop_calls_tenant_ts ON loop_calls(tenant, ts)"
DELETE_TENANT_LOOP_ROWS = (
    "DELETE FROM loop_calls WHERE id IN (SELECT id FROM loop_calls WHERE tenant = ? AND ts < ? LIMIT ?)"
)


@dataclass
class _Held:
    """One tenant as the prune weighs it: its event rows and their weight, and what it holds
    that no prune deletes (call records)."""

    rows: int
    weight: int
    pinned: int = 0

    @property
    def total(self) -> int:
        return max(0, self.weight) + self.pinned


def delete_to_size(job: PruneJob, target: int) -> None:
    """Delete events until the pages in use fit `target`, taking them from the largest tenants.

    The bytes to free are the pages over `target` scaled to the tenants' weight; the total is
    capped at 1.5 times the first estimate, so pages an index frees late never make a prune
    empty the journal.
    """
    used = job.look(used_bytes)
    if used <= target:
        return
    page_size = job.look(lambda db: pragma(db, "page_size"))
    held = job.look(functools.partial(_usage, page_size))
    budget: int | None = None
    cut: set[str] = set()
    kept = 0  # the weight of tenants with nothing deletable left: still in the pages in use
    for _ in range(MAX_PASSES):
        total = sum(h.total for h in held.values())
        if total <= 0:
            break
        excess = math.ceil((used - target) * (total + kept) / used)
        budget = math.ceil(excess * 1.5) + 1 if budget is None else budget
        cuts = fair_cuts({tenant: h.total for tenant, h in held.items()}, min(excess, budget))
        freed_now, ran_out = 0, False
        for tenant, share in sorted(cuts.items(), key=lambda item: (-item[1], item[0])):
            freed, exhausted = _give_up(job, tenant, share, held[tenant], page_size)
            freed_now += freed
            cut.add(tenant)
            if exhausted:  # what it has left is pinned: the others are asked in the next pass
                kept += held.pop(tenant).total
                ran_out = True
        budget -= freed_now
        used = job.look(used_bytes)
        if used <= target or budget <= 0 or (freed_now == 0 and not ran_out):
            break
    for tenant in sorted(cut):
        _forget_loop_rows(job, tenant)


def _usage(page_size: int, db: sqlite3.Connection) -> dict[str, _Held]:
    register(db, page_size)
    held = {str(t): _Held(int(rows), int(weight)) for t, rows, weight in db.execute(EVENT_USAGE).fetchall()}
    for tenant, pinned in db.execute(PINNED_USAGE).fetchall():
        held.setdefault(str(tenant), _Held(0, 0)).pinned = int(pinned)
    return held


def _give_up(job: PruneJob, tenant: str, share: int, held: _Held, page_size: int) -> tuple[int, bool]:
    """Delete `tenant`'s oldest events until they weigh `share`; (weight freed, nothing deletable left)."""
    freed = 0
    while freed < share and held.rows > 0:
        average = max(1.0, held.weight / held.rows)
        batch = min(BATCH_ROWS, max(1, math.ceil((share - freed) / average)))
        gone = job.paced(job.run, functools.partial(_delete_oldest_of, tenant, batch))
        weight = sum(row_weight(payload, keys, page_size) for payload, keys in gone)
        freed += weight
        held.rows, held.weight = held.rows - len(gone), held.weight - weight
        job.deleted["events"] += len(gone)
        if len(gone) < batch:
            return freed, True
    return freed, held.rows <= 0


def _forget_loop_rows(job: PruneJob, tenant: str) -> None:
    """A cut tenant's loop rows older than the oldest event it keeps (with a margin for events
    recorded out of order); none when it keeps no event."""
    oldest = job.look(lambda db: db.execute(OLDEST_KEPT, (tenant,)).fetchone())
    if oldest is None:
        return
    job.paced(job.run, lambda db: db.execute(LOOP_INDEX).rowcount)  # once per journal: then a no-op
    job.delete_batches(DELETE_TENANT_LOOP_ROWS, (tenant, float(oldest[0]) - OUT_OF_ORDER_S), "loop_rows")


def _delete_oldest_of(tenant: str, rows: int, db: sqlite3.Connection) -> list[tuple[int, int]]:
    return [(int(payload), int(keys)) for payload, keys in db.execute(DELETE_TENANT_OLDEST, (tenant, rows)).fetchall()]
