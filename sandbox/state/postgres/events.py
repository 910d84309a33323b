"""The journal's events on PostgreSQL: every replica's journal, shipped into one table.

Each replica's own journal (SQLite in its state_dir) stays the record a call commits to before
it runs (fast, local, and what its recovery reads); state/shipping.py copies its new events here
in batches, marked with the journal's id (`origin`) and row id (`origin_id`), so a batch shipped
twice lands once. A page is read newest first by this table's id, on an index that starts with
the tenant: a tenant's page never walks (or shows) a neighbour's rows.

Retention: `journal.retention` bounds this table as it bounds each journal. The age bound is
exact. The size bound is an estimate of the live rows (their number times their average size,
with the indexes' share): PostgreSQL reuses the space of deleted rows, so the table stops
growing near the bound; its files shrink only with a VACUUM FULL, which the service never runs
(it would lock the table for as long as the copy takes).
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio

from sandbox.journal.queries import Event, EventPage, check_limit, event_of, make_cursor, parse_cursor
from sandbox.state.protocol import SharedPrune

CHANNEL = "sbx_events"  # NOTIFY after a batch lands (the payload is empty): followers read again
COLUMNS = "id, ts, trace_id, call_id, session, tenant, agent, tool, stage, duration_ms, data"
INSERT = (
    "INSERT INTO sbx_events (origin, origin_id, ts, trace_id, call_id, session, tenant, agent, tool, stage, "
    "duration_ms, data) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (origin, origin_id) DO NOTHING"
)
PRUNE_LOCK = 0x5B5_0002  # pg_try_advisory_lock key: one replica prunes at a time, the others skip
PRUNE_BATCH = 5000  # rows per DELETE (each its own short transaction)
PRUNE_PAUSE_S = 0.01
INDEX_BYTES_PER_ROW = 160  # the five indexes' entries of one row, about (size estimate only)
LOW_WATER = 0.9  # a size prune goes this far under the bound


async def add(conn: Any, origin: str, events: list[Event]) -> None:
    """Insert `events` of the journal `origin` (one transaction; rows already there are skipped)."""
    rows = [
        (origin, e.id, e.ts, e.trace_id, e.call_id, e.session, e.tenant, e.agent, e.tool, e.stage, e.duration_ms,
         json.dumps(e.data, default=str))
        for e in events
    ]  # fmt: skip
    async with conn.transaction():
        async with conn.cursor() as cur:
            await cur.executemany(INSERT, rows)
        await conn.execute(f"NOTIFY {CHANNEL}")


async def shipped_up_to(conn: Any, origin: str) -> int:
    """The newest row of journal `origin` already here (0: none)."""
    cur = await conn.execute("SELECT coalesce(max(origin_id), 0) FROM sbx_events WHERE origin = %s", (origin,))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def page(
    conn: Any,
    *,
    tenant: str | None,
    session: str | None,
    trace_id: str | None,
    since: float | None,
    until: float | None,
    cursor: str | None,
    limit: int,
) -> EventPage:
    """One page, newest first, with the cursor of the next (older) one (see Journal.page)."""
    check_limit(limit)
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("tenant", tenant), ("session", session), ("trace_id", trace_id)):
        if value is not None:
            where.append(f"{column} = %s")
            args.append(value)
    if since is not None:
        where.append("ts >= %s")
        args.append(since)
    if until is not None:
        where.append("ts <= %s")
        args.append(until)
    if cursor is not None:
        where.append("id < %s")
        args.append(parse_cursor(cursor))
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    cur = await conn.execute(
        f"SELECT {COLUMNS} FROM sbx_events {clause} ORDER BY id DESC LIMIT %s",  # noqa: S608 - fixed words
        (*args, limit + 1),
    )
    rows = await cur.fetchall()
    events = [event_of(row) for row in rows[:limit]]
    return EventPage(events, make_cursor(events[-1].id) if len(rows) > limit else None)


async def after(conn: Any, *, tenant: str, session: str | None, after_id: int, limit: int) -> list[Event]:
    """A tenant's events newer than `after_id`, oldest first (a follower's next read)."""
    where, args = ["tenant = %s", "id > %s"], [tenant, after_id]
    if session is not None:
        where.append("session = %s")
        args.append(session)
    cur = await conn.execute(
        f"SELECT {COLUMNS} FROM sbx_events WHERE {' AND '.join(where)} ORDER BY id LIMIT %s",  # noqa: S608
        (*args, limit),
    )
    return [event_of(row) for row in await cur.fetchall()]


async def newest_id(conn: Any) -> int:
    """The newest row's id (0: none): where a follower starts."""
    cur = await conn.execute("SELECT coalesce(max(id), 0) FROM sbx_events")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def prune(conn: Any, *, max_age_s: float | None, max_bytes: int | None, now: float) -> SharedPrune:
    """Apply the retention bounds (see the module's docstring); one replica at a time."""
    started = time.monotonic()
    cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (PRUNE_LOCK,))
    got = await cur.fetchone()
    if not got or not got[0]:
        return SharedPrune(0, 0, 0.0, skipped=True)
    deleted = 0
    try:
        before = await _estimated_bytes(conn)
        if max_age_s is not None:
            deleted += await _delete_batches(conn, "ts < %s", (now - max_age_s,), None)
        if max_bytes is not None:
            rows, row_bytes = await _rows_and_size(conn)
            if rows * row_bytes > max_bytes:
                keep = int(max_bytes * LOW_WATER / max(row_bytes, 1))
                deleted += await _delete_batches(conn, "TRUE", (), max(rows - keep, 0))
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (PRUNE_LOCK,))
    return SharedPrune(deleted, before, time.monotonic() - started)


async def _delete_batches(conn: Any, condition: str, args: tuple[Any, ...], at_most: int | None) -> int:
    """Delete the oldest rows meeting `condition`, a batch per transaction, `at_most` in all."""
    deleted = 0
    while at_most is None or deleted < at_most:
        batch = PRUNE_BATCH if at_most is None else min(PRUNE_BATCH, at_most - deleted)
        cur = await conn.execute(
            f"DELETE FROM sbx_events WHERE id IN (SELECT id FROM sbx_events WHERE {condition} "  # noqa: S608
            "ORDER BY id LIMIT %s)",
            (*args, batch),
        )
        deleted += cur.rowcount
        if cur.rowcount < batch:
            break
        await anyio.sleep(PRUNE_PAUSE_S)  # writers and readers get the table between batches
    return deleted


async def _rows_and_size(conn: Any) -> tuple[int, int]:
    """The live rows (by their id range: ids only grow, and the oldest go first) and the bytes
    of one, with its index entries (from the newest thousand)."""
    cur = await conn.execute("SELECT coalesce(max(id) - min(id) + 1, 0) FROM sbx_events")
    row = await cur.fetchone()
    rows = int(row[0]) if row else 0
    cur = await conn.execute(
        "SELECT coalesce(avg(pg_column_size(e.*)), 0) FROM (SELECT * FROM sbx_events ORDER BY id DESC LIMIT 1000) e"
    )
    row = await cur.fetchone()
    return rows, int(float(row[0]) if row else 0) + INDEX_BYTES_PER_ROW


async def _estimated_bytes(conn: Any) -> int:
    rows, row_bytes = await _rows_and_size(conn)
    return rows * row_bytes
