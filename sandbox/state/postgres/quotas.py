"""Quota reservations on PostgreSQL: one transaction per admission, serialized per tenant.

`pg_advisory_xact_lock` on the tenant makes the check and the take one step across every
replica (a burst split across replicas never passes the quota); times are the database's clock,
so replicas' clocks never disagree about a window or a lease. Reservations of an owner whose
lease ran out (a replica killed) stop counting at the next admission of their tenant.
"""

from __future__ import annotations

import secrets
from typing import Any

from sandbox.state.protocol import QuotaLimits, Refused, Reservation

WINDOW_S = 60.0
# a session key is claimed only while its first requests are admitted (seconds): a claim this old
# was lost (its replica died before it confirmed or refunded) and stops counting
CLAIM_KEEP_S = 120.0


async def renew(conn: Any, owner: str, lease_s: float) -> None:
    """Upsert `owner`'s lease to now + `lease_s` (the database's now)."""
    await conn.execute(
        "INSERT INTO owners (owner, lease_until) VALUES (%s, extract(epoch FROM clock_timestamp()) + %s) "
        "ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until",
        (owner, lease_s),
    )


async def reserve(
    conn: Any,
    owner: str,
    lease_s: float,
    tenant: str,
    limits: QuotaLimits,
    calls: int,
    slots: int,
    session: str | None = None,
) -> Reservation | Refused:
    """Check and take, in one transaction on `conn` (see the module's docstring); with `session`
    and `limits.max_sessions`, the session key too (QuotaStore.reserve).

    Pipelined: the lock, the lease, the clean-up and the counts go out together and come back in
    one round trip; the take (or nothing) and the commit in a second one.
    """
    counted = session if limits.max_sessions else None
    async with conn.pipeline(), conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"sbx-quota|{tenant}",))
        await renew(conn, owner, lease_s)
        # what a dead owner held goes; a reservation whose owner row is gone counts for no one
        await conn.execute(
            "DELETE FROM reservations r WHERE r.tenant = %s AND NOT EXISTS (SELECT 1 FROM owners o "
            "WHERE o.owner = r.owner AND o.lease_until >= extract(epoch FROM clock_timestamp()))",
            (tenant,),
        )
        await conn.execute(
            "DELETE FROM call_starts WHERE tenant = %s AND started < extract(epoch FROM clock_timestamp()) - %s",
            (tenant, WINDOW_S),
        )
        cur = await conn.execute(
            "SELECT extract(epoch FROM clock_timestamp())::float8, "
            "(SELECT count(*) FROM call_starts WHERE tenant = %s), "
            "(SELECT min(started) FROM call_starts WHERE tenant = %s), "
            "(SELECT coalesce(sum(slots), 0) FROM reservations WHERE tenant = %s)",
            (tenant, tenant, tenant),
        )
        held_sessions = None
        if counted is not None:  # in the same round trip
            await conn.execute(
                "DELETE FROM sbx_tenant_sessions WHERE tenant = %s AND NOT admitted "
                "AND at < extract(epoch FROM clock_timestamp()) - %s",
                (tenant, CLAIM_KEEP_S),
            )
            held_sessions = await conn.execute(
                "SELECT (SELECT admitted FROM sbx_tenant_sessions WHERE tenant = %s AND key = %s), "
                "(SELECT count(*) FROM sbx_tenant_sessions WHERE tenant = %s)",
                (tenant, counted, tenant),
            )
        now, count, oldest, held = await cur.fetchone()
        admitted, open_sessions = (await held_sessions.fetchone()) if held_sessions is not None else (None, 0)
        if limits.max_calls_per_minute and calls and count + calls > limits.max_calls_per_minute:
            retry = max(1, int(WINDOW_S - (now - oldest)) + 1) if oldest is not None else 1
            return Refused("max_calls_per_minute", int(count), limits.max_calls_per_minute, retry)
        if limits.max_concurrent_calls and slots and held + slots > limits.max_concurrent_calls:
            return Refused("max_concurrent_calls", int(held), limits.max_concurrent_calls, 1)
        claimed = None
        if counted is not None and admitted is None:  # a new key: it counts toward max_sessions
            if open_sessions >= limits.max_sessions:
                return Refused("max_sessions", int(open_sessions), limits.max_sessions, 60)
            await conn.execute(
                "INSERT INTO sbx_tenant_sessions (tenant, key, admitted, holders, at) VALUES (%s, %s, false, 1, %s)",
                (tenant, counted, now),
            )
            claimed = counted
        elif counted is not None and not admitted:  # claimed by requests not admitted yet: share it
            await conn.execute(
                "UPDATE sbx_tenant_sessions SET holders = holders + 1 WHERE tenant = %s AND key = %s",
                (tenant, counted),
            )
            claimed = counted
        reservation = Reservation(f"q-{secrets.token_hex(8)}", tenant, calls, slots, claimed)
        await conn.execute(
            "INSERT INTO reservations (id, tenant, owner, slots, created) VALUES (%s, %s, %s, %s, %s)",
            (reservation.id, tenant, owner, slots, now),
        )
        if calls:
            await conn.execute(
                "INSERT INTO call_starts (tenant, started, reservation) SELECT %s, %s, %s FROM generate_series(1, %s)",
                (tenant, now, reservation.id, calls),
            )
        return reservation


async def release(conn: Any, reservation: Reservation, *, refund: bool) -> None:
    """The reservation's slots go back (and its starts and its share of a session claim too
    when `refund`)."""
    if not refund:  # one statement: no transaction to open and close
        await conn.execute("DELETE FROM reservations WHERE id = %s", (reservation.id,))
        return
    async with conn.pipeline(), conn.transaction():
        await conn.execute("DELETE FROM reservations WHERE id = %s", (reservation.id,))
        await conn.execute("DELETE FROM call_starts WHERE reservation = %s", (reservation.id,))
        if reservation.session is not None:  # the last refused request on a key never admitted frees it
            await conn.execute(
                "UPDATE sbx_tenant_sessions SET holders = holders - 1 WHERE tenant = %s AND key = %s AND NOT admitted",
                (reservation.tenant, reservation.session),
            )
            await conn.execute(
                "DELETE FROM sbx_tenant_sessions WHERE tenant = %s AND key = %s AND NOT admitted AND holders <= 0",
                (reservation.tenant, reservation.session),
            )


async def confirm_session(conn: Any, reservation: Reservation, limit: int) -> bool:
    """The claimed key is an open session now. When its claim went meanwhile (the session was
    closed, or the claim was lost), it takes a place again only if one is free: False when none is."""
    if reservation.session is None:
        return True
    key = (reservation.tenant, reservation.session)
    cur = await conn.execute(
        "UPDATE sbx_tenant_sessions SET admitted = true, holders = 0 WHERE tenant = %s AND key = %s RETURNING 1", key
    )
    if await cur.fetchone() is not None:
        return True
    async with conn.transaction():
        lock = f"sbx-quota|{reservation.tenant}"  # the lock reserve() takes: the count cannot move meanwhile
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock,))
        cur = await conn.execute("SELECT count(*) FROM sbx_tenant_sessions WHERE tenant = %s", (reservation.tenant,))
        row = await cur.fetchone()
        if limit and row is not None and int(row[0]) >= limit:
            return False
        await conn.execute(
            "INSERT INTO sbx_tenant_sessions (tenant, key, admitted, holders, at) "
            "VALUES (%s, %s, true, 0, extract(epoch FROM clock_timestamp())) "
            "ON CONFLICT (tenant, key) DO UPDATE SET admitted = true, holders = 0",
            key,
        )
    return True


async def close_sessions(conn: Any, tenant: str, keys: list[str]) -> None:
    """The keys no longer count toward the tenant's max_sessions."""
    await conn.execute("DELETE FROM sbx_tenant_sessions WHERE tenant = %s AND key = ANY(%s)", (tenant, keys))


async def in_flight(conn: Any, tenant: str) -> int:
    """Slots held for `tenant` by owners whose lease holds."""
    cur = await conn.execute(
        "SELECT coalesce(sum(r.slots), 0) FROM reservations r JOIN owners o ON o.owner = r.owner "
        "WHERE r.tenant = %s AND o.lease_until >= extract(epoch FROM clock_timestamp())",
        (tenant,),
    )
    row = await cur.fetchone()
    return int(row[0])


async def drop_owner(conn: Any, owner: str) -> None:
    """A store closing cleanly: what it still holds goes back at once (no lease to wait out)."""
    async with conn.transaction():
        await conn.execute("DELETE FROM reservations WHERE owner = %s", (owner,))
        await conn.execute("DELETE FROM sbx_sandbox_makes WHERE owner = %s", (owner,))
        await conn.execute("DELETE FROM owners WHERE owner = %s", (owner,))
