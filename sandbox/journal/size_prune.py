"""The journal's size bound (`journal.retention.max_bytes`): the tenants that hold the most give
up their oldest events first, down to one level (journal/fair_share.py), so one tenant writing
fast pushes out its own history, never its neighbours'.

A prune over the bound weighs every tenant's events once, on the prune's own connection (no
write lock held; about a second per 700 MB from the page cache on this project's machines), then
deletes each cut tenant's oldest events in short batches until it has given up its share, and
then that tenant's loop-detection rows older than the oldest event it keeps (its calls of then
are gone). Events of open calls and of calls waiting for approval are never deleted: a tenant
whose other events are gone keeps those, and the rest is asked of the others in the next pass.
"""

from __future__ import annotations

import functools
import math
import sqlite3

from sandbox.journal.fair_share import fair_cuts
from sandbox.journal.prune_steps import BATCH_ROWS, PruneJob, used_bytes

# what a row weighs besides its data: its other columns and its seven index entries (390 bytes
# measured with real ids); the unit of the fair share, scaled to the pages in use
ROW_OVERHEAD = 400
MAX_PASSES = 4  # a pass that frees too little (pages an index frees late) is followed by another
TENANT_USAGE = "SELECT tenant, COUNT(*), COALESCE(SUM(length(CAST(data AS BLOB))), 0) FROM events GROUP BY tenant"
# a tenant's oldest events that no open call and no pending approval needs, on the tenant index
# (in id order within a tenant: no sort); the sizes of what went come back
DELETE_TENANT_OLDEST = (
    "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE tenant = ? "
    "AND call_id NOT IN (SELECT call_id FROM open_calls) "
    "AND call_id NOT IN (SELECT call_id FROM approvals WHERE status = 'pending') "
    "ORDER BY id LIMIT ?) RETURNING length(CAST(data AS BLOB))"
)
OLDEST_KEPT = "SELECT ts FROM events WHERE tenant = ? ORDER BY id LIMIT 1"
DELETE_TENANT_LOOP_ROWS = (
    "DELETE FROM loop_calls WHERE id IN (SELECT id FROM loop_calls WHERE tenant = ? AND ts < ? ORDER BY id LIMIT ?)"
)


class _Held:
    """One tenant's events as the prune weighs them: rows, and bytes with ROW_OVERHEAD each."""

    def __init__(self, rows: int, data_bytes: int) -> None:
        self.rows, self.weight = rows, data_bytes + rows * ROW_OVERHEAD


def delete_to_size(job: PruneJob, target: int, now: float) -> None:
    """Delete events until the pages in use fit `target`, taking them from the largest tenants.

    The bytes to free are the pages over `target` scaled to the events' weight; the total is
    capped at 1.5 times the first estimate, so pages an index frees late never make a prune
    empty the journal.
    """
    used = job.look(used_bytes)
    if used <= target:
        return
    held = {tenant: _Held(rows, size) for tenant, rows, size in job.look(_tenant_usage)}
    budget: int | None = None
    cut: set[str] = set()
    kept = 0  # the weight of tenants with nothing deletable left: still in the pages in use
    for _ in range(MAX_PASSES):
        total = sum(h.weight for h in held.values())
        if total <= 0:
            break
        excess = math.ceil((used - target) * (total + kept) / used)
        budget = math.ceil(excess * 1.5) + 1 if budget is None else budget
        cuts = fair_cuts({tenant: h.weight for tenant, h in held.items()}, min(excess, budget))
        freed_now = 0
        for tenant, share in sorted(cuts.items(), key=lambda item: (-item[1], item[0])):
            freed, exhausted = _give_up(job, tenant, share, held[tenant])
            freed_now += freed
            cut.add(tenant)
            if exhausted:  # what it has left is kept (open calls): the others are asked next pass
                kept += max(0, held.pop(tenant).weight)
        budget -= freed_now
        used = job.look(used_bytes)
        if used <= target or freed_now == 0 or budget <= 0:
            break
    for tenant in sorted(cut):
        _forget_loop_rows(job, tenant, now)


def _give_up(job: PruneJob, tenant: str, share: int, held: _Held) -> tuple[int, bool]:
    """Delete `tenant`'s oldest events until they weigh `share`; (weight freed, nothing deletable left)."""
    freed = 0
    while freed < share and held.rows > 0:
        average = max(1.0, held.weight / held.rows)
        batch = min(BATCH_ROWS, max(1, math.ceil((share - freed) / average)))
        sizes = job.paced(job.run, functools.partial(_delete_oldest_of, tenant, batch))
        weight = sum(sizes) + len(sizes) * ROW_OVERHEAD
        freed += weight
        held.rows, held.weight = held.rows - len(sizes), held.weight - weight
        job.deleted["events"] += len(sizes)
        if len(sizes) < batch:
            return freed, True
    return freed, held.rows <= 0


def _forget_loop_rows(job: PruneJob, tenant: str, now: float) -> None:
    """A cut tenant's loop rows older than the oldest event it keeps (all of them when none is kept)."""
    oldest = job.look(lambda db: db.execute(OLDEST_KEPT, (tenant,)).fetchone())
    job.delete_batches(DELETE_TENANT_LOOP_ROWS, (tenant, float(oldest[0]) if oldest else now), "loop_rows")


def _tenant_usage(db: sqlite3.Connection) -> list[tuple[str, int, int]]:
    return [(str(t), int(rows), int(size)) for t, rows, size in db.execute(TENANT_USAGE).fetchall()]


def _delete_oldest_of(tenant: str, rows: int, db: sqlite3.Connection) -> list[int]:
    return [int(row[0]) for row in db.execute(DELETE_TENANT_OLDEST, (tenant, rows)).fetchall()]
