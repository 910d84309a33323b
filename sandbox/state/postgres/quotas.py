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


async def renew(conn: Any, owner: str, lease_s: float) -> None:
    """Upsert `owner`'s lease to now + `lease_s` (the database's now)."""
    await conn.execute(
        "INSERT INTO owners (owner, lease_until) VALUES (%s, extract(epoch FROM clock_timestamp()) + %s) "
        "ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until",
        (owner, lease_s),
    )


async def reserve(
    conn: Any, owner: str, lease_s: float, tenant: str, limits: QuotaLimits, calls: int, slots: int
) -> Reservation | Refused:
    """Check and take, in one transaction on `conn` (see the module's docstring).

    Pipelined: the lock, the lease, the clean-up and the counts go out together and come back in
    one round trip; the take (or nothing) and the commit in a second one.
    """
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
        now, count, oldest, held = await cur.fetchone()
        if limits.max_calls_per_minute and calls and count + calls > limits.max_calls_per_minute:
            retry = max(1, int(WINDOW_S - (now - oldest)) + 1) if oldest is not None else 1
            return Refused("max_calls_per_minute", int(count), limits.max_calls_per_minute, retry)
        if limits.max_concurrent_calls and slots and held + slots > limits.max_concurrent_calls:
            return Refused("max_concurrent_calls", int(held), limits.max_concurrent_calls, 1)
        reservation = Reservation(f"q-{secrets.token_hex(8)}", tenant, calls, slots)
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
    """The reservation's slots go back (and its starts too when `refund`)."""
    if not refund:  # one statement: no transaction to open and close
        await conn.execute("DELETE FROM reservations WHERE id = %s", (reservation.id,))
        return
    async with conn.pipeline(), conn.transaction():
        await conn.execute("DELETE FROM reservations WHERE id = %s", (reservation.id,))
        await conn.execute("DELETE FROM call_starts WHERE reservation = %s", (reservation.id,))


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
        await conn.execute("DELETE FROM owners WHERE owner = %s", (owner,))
