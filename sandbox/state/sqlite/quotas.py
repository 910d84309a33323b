"""Quota reservations on SQLite: one `BEGIN IMMEDIATE` transaction per admission (SQLite has one
writer at a time, so the check and the take are one step for every process on the file).

An owner's reservations stop counting when it is gone: on this host the kernel says so at once
(journal/owners.py), elsewhere its lease does.
"""

from __future__ import annotations

import secrets
import sqlite3
import time

from sandbox.journal.owners import owner_alive
from sandbox.state.protocol import QuotaLimits, Refused, Reservation

WINDOW_S = 60.0
CLAIM_KEEP_S = 120.0  # a session claim this old was lost (postgres/quotas.py says why)


def renew(db: sqlite3.Connection, owner: str, lease_s: float) -> None:
    """Upsert `owner`'s lease to now + `lease_s` (inside the caller's transaction, or alone)."""
    db.execute(
        "INSERT INTO owners (owner, lease_until) VALUES (?, ?) "
        "ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until",
        (owner, time.time() + lease_s),
    )


def _forget_dead(db: sqlite3.Connection, tenant: str, now: float) -> None:
    rows = db.execute(
        "SELECT DISTINCT r.owner, o.lease_until FROM reservations r LEFT JOIN owners o ON o.owner = r.owner "
        "WHERE r.tenant = ?",
        (tenant,),
    ).fetchall()
    for owner, lease in rows:
        if not owner_alive(owner, lease, now):
            db.execute("DELETE FROM reservations WHERE tenant = ? AND owner = ?", (tenant, owner))


def reserve(
    db: sqlite3.Connection,
    owner: str,
    lease_s: float,
    tenant: str,
    limits: QuotaLimits,
    calls: int,
    slots: int,
    session: str | None = None,
) -> Reservation | Refused:
    """Check and take in one write transaction (see the module's docstring); with `session` and
    `limits.max_sessions`, the session key too (QuotaStore.reserve)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        now = time.time()
        renew(db, owner, lease_s)
        _forget_dead(db, tenant, now)
        db.execute("DELETE FROM call_starts WHERE tenant = ? AND started < ?", (tenant, now - WINDOW_S))
        refused = _check(db, tenant, limits, calls, slots, now)
        claimed: str | None = None
        if refused is None and session is not None and limits.max_sessions:
            refused, claimed = _take_session(db, tenant, session, limits.max_sessions, now)
        if refused is not None:
            db.execute("COMMIT")  # the lease and the clean-up hold; nothing was taken
            return refused
        reservation = Reservation(f"q-{secrets.token_hex(8)}", tenant, calls, slots, claimed)
        db.execute(
            "INSERT INTO reservations (id, tenant, owner, slots, created) VALUES (?, ?, ?, ?, ?)",
            (reservation.id, tenant, owner, slots, now),
        )
        db.executemany(
            "INSERT INTO call_starts (tenant, started, reservation) VALUES (?, ?, ?)",
            [(tenant, now, reservation.id)] * calls,
        )
        db.execute("COMMIT")
        return reservation
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _check(
    db: sqlite3.Connection, tenant: str, limits: QuotaLimits, calls: int, slots: int, now: float
) -> Refused | None:
    if limits.max_calls_per_minute and calls:
        count, oldest = db.execute(
            "SELECT count(*), min(started) FROM call_starts WHERE tenant = ?", (tenant,)
        ).fetchone()
        if count + calls > limits.max_calls_per_minute:
            retry = max(1, int(WINDOW_S - (now - oldest)) + 1) if oldest is not None else 1
            return Refused("max_calls_per_minute", int(count), limits.max_calls_per_minute, retry)
    if limits.max_concurrent_calls and slots:
        (held,) = db.execute("SELECT coalesce(sum(slots), 0) FROM reservations WHERE tenant = ?", (tenant,)).fetchone()
        if held + slots > limits.max_concurrent_calls:
            return Refused("max_concurrent_calls", int(held), limits.max_concurrent_calls, 1)
    return None


def _take_session(
    db: sqlite3.Connection, tenant: str, key: str, limit: int, now: float
) -> tuple[Refused | None, str | None]:
    """A key held open costs nothing; a claimed one is shared; a new one is claimed if it fits.
    Returns what refuses it (or None) and the key claimed (or None)."""
    db.execute(
        "DELETE FROM sbx_tenant_sessions WHERE tenant = ? AND NOT admitted AND at < ?", (tenant, now - CLAIM_KEEP_S)
    )
    row = db.execute("SELECT admitted FROM sbx_tenant_sessions WHERE tenant = ? AND key = ?", (tenant, key)).fetchone()
    if row is not None and row[0]:
        return None, None
    if row is not None:
        db.execute("UPDATE sbx_tenant_sessions SET holders = holders + 1 WHERE tenant = ? AND key = ?", (tenant, key))
        return None, key
    (held,) = db.execute("SELECT count(*) FROM sbx_tenant_sessions WHERE tenant = ?", (tenant,)).fetchone()
    if held >= limit:
        return Refused("max_sessions", int(held), limit, 60), None
    db.execute(
        "INSERT INTO sbx_tenant_sessions (tenant, key, admitted, holders, at) VALUES (?, ?, 0, 1, ?)",
        (tenant, key, now),
    )
    return None, key


def confirm_session(db: sqlite3.Connection, reservation: Reservation, limit: int) -> bool:
    """The claimed key is an open session now; if its claim went meanwhile, it takes a place
    again only if one is free (postgres/quotas.py says why): False when none is."""
    if reservation.session is None:
        return True
    key = (reservation.tenant, reservation.session)
    db.execute("BEGIN IMMEDIATE")
    try:
        updated = db.execute(
            "UPDATE sbx_tenant_sessions SET admitted = 1, holders = 0 WHERE tenant = ? AND key = ?", key
        ).rowcount
        if not updated:
            (held,) = db.execute(
                "SELECT count(*) FROM sbx_tenant_sessions WHERE tenant = ?", (reservation.tenant,)
            ).fetchone()
            if limit and held >= limit:
                db.execute("COMMIT")
                return False
            db.execute(
                "INSERT INTO sbx_tenant_sessions (tenant, key, admitted, holders, at) VALUES (?, ?, 1, 0, ?)",
                (*key, time.time()),
            )
        db.execute("COMMIT")
        return True
    except BaseException:
        db.execute("ROLLBACK")
        raise


def close_sessions(db: sqlite3.Connection, tenant: str, keys: list[str]) -> None:
    """The keys no longer count toward the tenant's max_sessions."""
    db.executemany("DELETE FROM sbx_tenant_sessions WHERE tenant = ? AND key = ?", [(tenant, k) for k in keys])


def release(db: sqlite3.Connection, reservation: Reservation, *, refund: bool) -> None:
    """The reservation's slots go back (and its starts and its share of a session claim too
    when `refund`)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("DELETE FROM reservations WHERE id = ?", (reservation.id,))
        if refund:
            db.execute("DELETE FROM call_starts WHERE reservation = ?", (reservation.id,))
        if refund and reservation.session is not None:  # the last refused request on a new key frees it
            key = (reservation.tenant, reservation.session)
            db.execute(
                "UPDATE sbx_tenant_sessions SET holders = holders - 1 WHERE tenant = ? AND key = ? AND NOT admitted",
                key,
            )
            db.execute(
                "DELETE FROM sbx_tenant_sessions WHERE tenant = ? AND key = ? AND NOT admitted AND holders <= 0", key
            )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def in_flight(db: sqlite3.Connection, tenant: str) -> int:
    """Slots held for `tenant` by owners still alive."""
    now = time.time()
    rows = db.execute(
        "SELECT r.owner, o.lease_until, sum(r.slots) FROM reservations r LEFT JOIN owners o ON o.owner = r.owner "
        "WHERE r.tenant = ? GROUP BY r.owner",
        (tenant,),
    ).fetchall()
    return sum(int(held) for owner, lease, held in rows if owner_alive(owner, lease, now))


def drop_owner(db: sqlite3.Connection, owner: str) -> None:
    """A store closing cleanly: what it still holds goes back at once."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("DELETE FROM reservations WHERE owner = ?", (owner,))
        db.execute("DELETE FROM owners WHERE owner = ?", (owner,))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
