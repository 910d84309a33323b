"""Tenant tokens' hashes on PostgreSQL: one table every replica reads, and a NOTIFY with each
change (in the same transaction), so a replica reloads them the moment a token is made or
revoked anywhere (api/shared_tokens.py)."""

from __future__ import annotations

from typing import Any

from sandbox.errors import UsageError

CHANNEL = "sbx_tokens"


async def add(conn: Any, tenant: str, name: str, sha256: str) -> None:
    """Store a token's hash.

    Raises:
        UsageError: the tenant already has a token of that name.
    """
    async with conn.transaction():
        cur = await conn.execute(
            "INSERT INTO sbx_tokens (tenant, name, sha256, created) "
            "VALUES (%s, %s, %s, extract(epoch FROM clock_timestamp())) ON CONFLICT DO NOTHING",
            (tenant, name, sha256),
        )
        if cur.rowcount != 1:
            raise UsageError(f"tenant {tenant!r} already has a token named {name!r}")
        await conn.execute(f"NOTIFY {CHANNEL}")


async def remove(conn: Any, tenant: str, name: str) -> bool:
    """Delete a token's hash: False when there was none of that name."""
    async with conn.transaction():
        cur = await conn.execute("DELETE FROM sbx_tokens WHERE tenant = %s AND name = %s", (tenant, name))
        if cur.rowcount:
            await conn.execute(f"NOTIFY {CHANNEL}")
        return bool(cur.rowcount)


async def every(conn: Any) -> list[dict[str, str]]:
    """Every stored token as the token file holds them ({tenant, name, sha256}), oldest first."""
    cur = await conn.execute("SELECT tenant, name, sha256 FROM sbx_tokens ORDER BY created, tenant, name")
    return [{"tenant": r[0], "name": r[1], "sha256": r[2]} for r in await cur.fetchall()]
