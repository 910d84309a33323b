"""What replicas on one engine must agree on, on PostgreSQL (the SessionUids, the SessionRecords and
SharedPoolClaims of sandbox/state/protocol.py): a session uid is claimed by one INSERT against the
table's two unique keys, so of replicas claiming at once one wins and a session holds one uid
per container; a warm-pool member is claimed by one INSERT on its container id; a sandbox being
made is recorded under the tenant's lock before the engine is listed (record_make)."""

from __future__ import annotations

import secrets
from typing import Any


async def find(conn: Any, scope: str, session: str) -> tuple[int, str] | None:
    """The uid and token `session` holds in `scope`, or None."""
    cur = await conn.execute(
        "SELECT uid, token FROM sbx_session_uids WHERE scope = %s AND session = %s", (scope, session)
    )
    row = await cur.fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


async def claim(conn: Any, scope: str, uid: int, session: str, token: str) -> tuple[str, str] | None:
    """Take `uid` for `session` whole or not at all; who holds it afterwards (session, token),
    or None when the session itself got another uid meanwhile (read it with :func:`find`)."""
    cur = await conn.execute(
        "INSERT INTO sbx_session_uids (scope, uid, session, token) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING RETURNING session, token",
        (scope, uid, session, token),
    )
    row = await cur.fetchone()
    if row is not None:
        return str(row[0]), str(row[1])
    cur = await conn.execute("SELECT session, token FROM sbx_session_uids WHERE scope = %s AND uid = %s", (scope, uid))
    row = await cur.fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


# a claimed member is renamed to its session within seconds: a claim older than this whose
# container still waits under its pool name was lost (its replica died, or the answer did), and
# the member may be claimed again
CLAIM_KEEP_S = 600.0


async def claim_member(conn: Any, container_id: str, session: str) -> bool:
    """Claim a warm-pool member for `session`: False when another replica claimed it first
    (less than CLAIM_KEEP_S ago; an older claim was lost and gives way)."""
    async with conn.transaction():
        await conn.execute(
            "DELETE FROM sbx_pool_claims WHERE at < extract(epoch FROM clock_timestamp()) - %s", (CLAIM_KEEP_S,)
        )
        cur = await conn.execute(
            "INSERT INTO sbx_pool_claims (container_id, session, at) "
            "VALUES (%s, %s, extract(epoch FROM clock_timestamp())) ON CONFLICT DO NOTHING RETURNING 1",
            (container_id, session),
        )
        return await cur.fetchone() is not None


async def record(conn: Any, tenant: str, session: str, kind: str, key: str) -> str | None:
    """One session record, or None."""
    cur = await conn.execute(
        "SELECT value FROM sbx_session_records WHERE tenant = %s AND session = %s AND kind = %s AND key = %s",
        (tenant, session, kind, key),
    )
    row = await cur.fetchone()
    return None if row is None else str(row[0])


async def records(conn: Any, tenant: str, session: str, kind: str) -> dict[str, str]:
    """Every session record of one kind, by key."""
    cur = await conn.execute(
        "SELECT key, value FROM sbx_session_records WHERE tenant = %s AND session = %s AND kind = %s ORDER BY key",
        (tenant, session, kind),
    )
    return {str(r[0]): str(r[1]) for r in await cur.fetchall()}


async def put_record(
    conn: Any, tenant: str, session: str, kind: str, key: str, value: str | None, *, only_existing: bool = False
) -> None:
    """Upsert (or, for None, delete; with `only_existing`, only update) one session record."""
    if only_existing and value is not None:
        await conn.execute(
            "UPDATE sbx_session_records SET value = %s, updated = extract(epoch FROM clock_timestamp()) "
            "WHERE tenant = %s AND session = %s AND kind = %s AND key = %s",
            (value, tenant, session, kind, key),
        )
        return
    if value is None:
        await conn.execute(
            "DELETE FROM sbx_session_records WHERE tenant = %s AND session = %s AND kind = %s AND key = %s",
            (tenant, session, kind, key),
        )
        return
    await conn.execute(
        "INSERT INTO sbx_session_records (tenant, session, kind, key, value, updated) "
        "VALUES (%s, %s, %s, %s, %s, extract(epoch FROM clock_timestamp())) "
        "ON CONFLICT (tenant, session, kind, key) DO UPDATE SET value = excluded.value, updated = excluded.updated",
        (tenant, session, kind, key, value),
    )


async def prune(conn: Any, older_than: float) -> None:
    """What no replica asks for any more: session records not touched since `older_than` (a
    process table or a file's state of a session long gone), and ended records of unkeyed calls
    (a replica that was gone left them; nobody asks for their result)."""
    await conn.execute("DELETE FROM sbx_session_records WHERE updated < %s", (older_than,))
    await conn.execute(
        "DELETE FROM calls WHERE idem_key IS NULL AND state IN ('finished', 'abandoned') AND ended < %s",
        (older_than,),
    )


async def record_make(conn: Any, owner: str, tenant: str, sandbox: str) -> tuple[str, set[str]]:
    """Record a sandbox about to be made for `tenant`, under the tenant's advisory lock in one
    short transaction; return the make's id and the sandboxes other running calls are making
    (SandboxMakes.take_sandbox lists the engine after this, with no transaction open)."""
    make_id = f"m-{secrets.token_hex(8)}"
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"sbx-sandboxes|{tenant}",))
        # a make whose owner is gone no longer counts: its sandbox, if made, is in the list
        await conn.execute(
            "DELETE FROM sbx_sandbox_makes m WHERE m.tenant = %s AND NOT EXISTS (SELECT 1 FROM owners o "
            "WHERE o.owner = m.owner AND o.lease_until >= extract(epoch FROM clock_timestamp()))",
            (tenant,),
        )
        cur = await conn.execute("SELECT DISTINCT scope_key FROM sbx_sandbox_makes WHERE tenant = %s", (tenant,))
        making = {str(row[0]) for row in await cur.fetchall()}
        await conn.execute(
            "INSERT INTO sbx_sandbox_makes (id, tenant, scope_key, owner, at) "
            "VALUES (%s, %s, %s, %s, extract(epoch FROM clock_timestamp()))",
            (make_id, tenant, sandbox, owner),
        )
    return make_id, making


async def release_sandbox(conn: Any, make_id: str) -> None:
    """The make's call ended (or it was refused)."""
    await conn.execute("DELETE FROM sbx_sandbox_makes WHERE id = %s", (make_id,))
