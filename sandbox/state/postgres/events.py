"""The journal's events on PostgreSQL: every replica's journal, shipped into one table.

Each replica's own journal (SQLite in its state_dir) stays the record a call commits to before
it runs (fast, local, and what its recovery reads); state/shipping.py copies its new events here
in batches, marked with the journal's id (`origin`) and row id (`origin_id`), so a batch shipped
twice lands once, and `sbx_event_origins` keeps how far each journal was shipped (a restart
never ships again what retention removed). A page is read newest first by this table's id, on
an index that starts with the tenant: a tenant's page never walks (or shows) a neighbour's rows.

What is shipped is a view, bounded: an event's data larger than MAX_DATA_BYTES is replaced by a
note of its size and keys (the replica's own journal keeps it whole), text PostgreSQL refuses
(NUL, unpaired surrogates) is replaced, and rows are made and read off the event loop.

Retention: `journal.retention` bounds this table as it bounds each journal. `sbx_events_size`
holds the live rows and their bytes (each row's text plus ROW_OVERHEAD for its header and index
entries), kept exact by every insert and delete in the same statement, so the size bound deletes
exactly down to it, taking the oldest rows of the tenants that hold the most (as the journal
does: one tenant's flood pushes out its own rows, not its neighbours'). PostgreSQL reuses the
space of deleted rows, so the files stop growing near the bound; they shrink only with a VACUUM
FULL, which the service never runs.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import anyio

from sandbox.journal.fair_share import fair_cuts
from sandbox.journal.prune_steps import in_batches_async
from sandbox.journal.queries import Event, EventPage, check_limit, event_of, make_cursor, parse_cursor
from sandbox.state.postgres.connect import DATABASE_NOW
from sandbox.state.protocol import SharedPrune

COLUMNS = "id, ts, trace_id, call_id, session, tenant, agent, tool, stage, duration_ms, data"
MAX_DATA_BYTES = 64 * 1024  # an event's data larger than this is shipped as a note of its size
ROW_OVERHEAD = 200  # a row's header and its four index entries, about (the size bound's unit)
INSERT = (
    "WITH added AS (INSERT INTO sbx_events (origin, origin_id, ts, trace_id, call_id, session, tenant, agent, "
    "tool, stage, duration_ms, data, bytes) "
    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::float8[], %s::text[], %s::text[], %s::text[], %s::text[], "
    "%s::text[], %s::text[], %s::text[], %s::float8[], %s::text[], %s::int[]) "
    "ON CONFLICT (origin, origin_id) DO NOTHING RETURNING bytes) "
    "UPDATE sbx_events_size SET rows = rows + (SELECT count(*) FROM added), "
    "bytes = bytes + (SELECT coalesce(sum(bytes), 0) FROM added)"
)
SHIPPED = (
    "INSERT INTO sbx_event_origins (origin, shipped_up_to) VALUES (%s, %s) "
    "ON CONFLICT (origin) DO UPDATE "
    "SET shipped_up_to = greatest(sbx_event_origins.shipped_up_to, excluded.shipped_up_to)"
)
PRUNE_LOCK = 0x5B5_0002  # pg_try_advisory_lock key: one replica prunes at a time, the others skip
PRUNE_BATCH = 5000  # rows per DELETE (each its own short transaction)
PRUNE_PAUSE_S = 0.01
LOW_WATER = 0.9  # a size prune goes this far under the bound
SIZE_PASSES = 3  # rows shipped while a size prune runs are caught by its next pass
USAGE_TIMEOUT_MS = 300_000  # the per-tenant sum reads the whole table (1.2-1.6 s at 1.8 GB, warm)


def _text(value: str) -> str:
    """`value` as PostgreSQL text takes it: NUL and unpaired surrogates replaced."""
    return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def _data(event: Event) -> str:
    text = json.dumps(event.data, default=str)  # ASCII: NUL and surrogates are escapes here
    if len(text) <= MAX_DATA_BYTES:
        return text
    keys = sorted(str(k) for k in event.data)[:20] if isinstance(event.data, dict) else []
    return json.dumps({"truncated": True, "bytes": len(text), "keys": keys, "note": "whole in its replica's journal"})


def rows_of(origin: str, events: list[Event]) -> list[list[Any]]:
    """The INSERT's arrays (column by column) for `events` (CPU work: run it off the event loop)."""
    columns: list[list[Any]] = [[] for _ in range(13)]
    for e in events:
        texts = [_text(str(v)) for v in (e.trace_id, e.call_id, e.session, e.tenant, e.agent, e.tool, e.stage)]
        data = _data(e)
        row = [_text(origin), e.id, e.ts, *texts, e.duration_ms, data]
        row.append(sum(len(t) for t in texts) + len(data) + ROW_OVERHEAD)
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return columns


async def add(conn: Any, origin: str, events: list[Event]) -> None:
    """Insert `events` of the journal `origin` and note how far it is shipped (one transaction;
    rows already there are skipped)."""
    if not events:
        return
    columns = await anyio.to_thread.run_sync(rows_of, origin, events)
    async with conn.transaction():
        await conn.execute(INSERT, columns)
        await conn.execute(SHIPPED, (origin, max(e.id for e in events)))


async def shipped_up_to(conn: Any, origin: str) -> int:
    """How far journal `origin` was shipped (0: never)."""
    cur = await conn.execute("SELECT shipped_up_to FROM sbx_event_origins WHERE origin = %s", (origin,))
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
    tool: str | None = None,
) -> EventPage:
    """One page, newest first, with the cursor of the next (older) one (see Journal.page)."""
    check_limit(limit)
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("tenant", tenant), ("session", session), ("trace_id", trace_id), ("tool", tool)):
        if value is not None:
            where.append(f"{column} = %s")
            args.append(_text(value))
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
    events = await anyio.to_thread.run_sync(lambda: [event_of(row) for row in rows[:limit]])
    return EventPage(events, make_cursor(events[-1].id) if len(rows) > limit else None)


async def size(conn: Any) -> tuple[int, int]:
    """The live rows and their bytes."""
    cur = await conn.execute("SELECT rows, bytes FROM sbx_events_size")
    row = await cur.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


async def database_now(conn: Any) -> float:
    """The server's clock (epoch seconds): the one every replica's cutoffs are taken on."""
    cur = await conn.execute(DATABASE_NOW)
    row = await cur.fetchone()
    return float(row[0])


async def prune(conn: Any, *, max_age_s: float | None, max_bytes: int | None, now: float) -> SharedPrune:
    """Apply the retention bounds (see the module's docstring); one replica at a time."""
    started = time.monotonic()
    cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (PRUNE_LOCK,))
    got = await cur.fetchone()
    if not got or not got[0]:
        return SharedPrune(0, 0, 0.0, skipped=True)
    deleted = 0
    try:
        before = (await size(conn))[1]
        if max_age_s is not None:

            async def past_age(rows: int) -> int:
                return (await _delete_oldest(conn, "ts < %s", (now - max_age_s,), rows))[0]

            deleted += await in_batches_async(past_age, PRUNE_BATCH, pause_s=PRUNE_PAUSE_S)
        if max_bytes is not None and (await size(conn))[1] > max_bytes:
            deleted += await _delete_to_size(conn, int(max_bytes * LOW_WATER))
    finally:
        with anyio.CancelScope(shield=True):
            await conn.execute("SELECT pg_advisory_unlock(%s)", (PRUNE_LOCK,))
    return SharedPrune(deleted, before, time.monotonic() - started)


async def _delete_to_size(conn: Any, target: int) -> int:
    """Delete rows until their bytes fit `target`, the tenants that hold the most giving up their
    oldest first, down to one level (journal/fair_share.py): a tenant's flood pushes out its own
    rows, not its neighbours'. The bytes are exact (each row's, summed once per pass); rows
    shipped meanwhile are caught by a next pass."""
    deleted = 0
    for _ in range(SIZE_PASSES):
        total = (await size(conn))[1]
        if total <= target:
            break
        async with conn.transaction():  # a whole-table read: not cut by the pool's statement timeout
            await conn.execute(f"SET LOCAL statement_timeout = {USAGE_TIMEOUT_MS}")
            cur = await conn.execute("SELECT tenant, count(*), coalesce(sum(bytes), 0) FROM sbx_events GROUP BY tenant")
            held = {str(tenant): (int(rows), int(weight)) for tenant, rows, weight in await cur.fetchall()}
        cuts = fair_cuts({tenant: weight for tenant, (_, weight) in held.items()}, total - target)
        pass_deleted = 0
        for tenant, share in sorted(cuts.items(), key=lambda item: (-item[1], item[0])):
            pass_deleted += await _give_up(conn, tenant, share, *held[tenant])
        deleted += pass_deleted
        if pass_deleted == 0:
            break
    return deleted


async def _give_up(conn: Any, tenant: str, share: int, rows: int, weight: int) -> int:
    """Delete `tenant`'s oldest rows until their bytes reach `share` (or none is left); how many went."""
    deleted = freed = 0
    while freed < share and rows > 0:
        # as many of its oldest as its average row says, checked again after each batch
        count = min(PRUNE_BATCH, max(1, math.ceil((share - freed) * rows / max(weight, 1))))
        gone, gone_bytes = await _delete_oldest(conn, "tenant = %s", (tenant,), count)
        deleted, freed, rows, weight = deleted + gone, freed + gone_bytes, rows - gone, weight - gone_bytes
        if gone < count:
            break
        await anyio.sleep(PRUNE_PAUSE_S)
    return deleted


async def _delete_oldest(conn: Any, condition: str, args: tuple[Any, ...], count: int) -> tuple[int, int]:
    """Delete the `count` oldest rows meeting `condition`, the size row kept exact with them;
    how many went and their bytes."""
    cur = await conn.execute(
        "WITH gone AS (DELETE FROM sbx_events WHERE id IN (SELECT id FROM sbx_events "  # noqa: S608 - fixed words
        f"WHERE {condition} ORDER BY id LIMIT %s) RETURNING bytes) "
        "UPDATE sbx_events_size SET rows = rows - (SELECT count(*) FROM gone), "
        "bytes = bytes - (SELECT coalesce(sum(bytes), 0) FROM gone) "
        "RETURNING (SELECT count(*) FROM gone), (SELECT coalesce(sum(bytes), 0) FROM gone)",
        (*args, count),
    )
    row = await cur.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)
