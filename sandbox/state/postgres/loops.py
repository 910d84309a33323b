"""Loop detection's history on PostgreSQL (the SharedLoops of sandbox/state/protocol.py): every
replica appends a session's calls to one table and reads its last ones (and its breaker) in one
round trip, so repeats spread over replicas are counted together."""

from __future__ import annotations

import functools
from typing import Any

from sandbox.journal.prune_steps import in_batches_async

History = list[tuple[str, str, str]]
NOW = "extract(epoch FROM clock_timestamp())"
PRUNE_BATCH = 5000


async def add(conn: Any, tenant: str, session: str, tool: str, args: str, result: str) -> None:
    """Append one call of a session."""
    await conn.execute(
        f"INSERT INTO sbx_loop_calls (tenant, session, tool, args, result, ts) VALUES (%s, %s, %s, %s, %s, {NOW})",  # noqa: S608
        (tenant, session, tool, args, result),
    )


async def recent(conn: Any, tenant: str, session: str, window: int) -> tuple[bool, History]:
    """The breaker's state and the session's last `window` calls since its last reset, oldest first."""
    cur = await conn.execute(
        "WITH s AS (SELECT tripped, since_id FROM sbx_loop_sessions WHERE tenant = %s AND session = %s) "
        "SELECT (SELECT tripped FROM s), c.tool, c.args, c.result FROM (SELECT 1) one LEFT JOIN LATERAL "
        "(SELECT id, tool, args, result FROM sbx_loop_calls WHERE tenant = %s AND session = %s "
        "AND id > coalesce((SELECT since_id FROM s), 0) ORDER BY id DESC LIMIT %s) c ON TRUE ORDER BY c.id",
        (tenant, session, tenant, session, window),
    )
    rows = await cur.fetchall()
    tripped = bool(rows and rows[0][0])
    return tripped, [(str(r[1]), str(r[2]), str(r[3])) for r in rows if r[1] is not None]


async def trip(conn: Any, tenant: str, session: str) -> None:
    """Trip a session's circuit breaker (until a reset, or retention's max_age after the trip)."""
    await conn.execute(
        f"INSERT INTO sbx_loop_sessions (tenant, session, tripped, ts) VALUES (%s, %s, TRUE, {NOW}) "  # noqa: S608
        "ON CONFLICT (tenant, session) DO UPDATE SET tripped = TRUE, ts = excluded.ts",
        (tenant, session),
    )


async def reset(conn: Any, tenant: str, session: str) -> None:
    """Forget a session's calls so far and reset its breaker (on every replica)."""
    await conn.execute(
        "INSERT INTO sbx_loop_sessions (tenant, session, tripped, since_id, ts) "  # noqa: S608
        f"VALUES (%s, %s, FALSE, (SELECT coalesce(max(id), 0) FROM sbx_loop_calls), {NOW}) "
        "ON CONFLICT (tenant, session) DO UPDATE SET tripped = FALSE, since_id = excluded.since_id, ts = excluded.ts",
        (tenant, session),
    )


async def prune(conn: Any, older_than: float) -> int:
    """Delete calls, and breakers tripped or reset, older than `older_than` (journal.retention's
    age), in batches; how many rows went."""
    deleted = 0
    for sql in (
        "DELETE FROM sbx_loop_calls WHERE id IN (SELECT id FROM sbx_loop_calls WHERE ts < %s ORDER BY id LIMIT %s)",
        # a reset's mark hides only calls older than itself, which are gone by now too
        "DELETE FROM sbx_loop_sessions WHERE (tenant, session) IN "
        "(SELECT tenant, session FROM sbx_loop_sessions WHERE ts < %s LIMIT %s)",
    ):
        deleted += await in_batches_async(functools.partial(_delete, conn, sql, older_than), PRUNE_BATCH)
    return deleted


async def _delete(conn: Any, sql: str, older_than: float, rows: int) -> int:
    return int((await conn.execute(sql, (older_than, rows))).rowcount)
