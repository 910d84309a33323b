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
    db: sqlite3.Connection, owner: str, lease_s: float, tenant: str, limits: QuotaLimits, calls: int, slots: int
) -> Reservation | Refused:
    """Check and take in one write transaction (see the module's docstring)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        now = time.time()
        renew(db, owner, lease_s)
        _forget_dead(db, tenant, now)
        db.execute("DELETE FROM call_starts WHERE tenant = ? AND started < ?", (tenant, now - WINDOW_S))
        refused = _check(db, tenant, limits, calls, slots, now)
        if refused is not None:
            db.execute("COMMIT")  # the lease and the clean-up hold; nothing was taken
            return refused
        reservation = Reservation(f"q-{secrets.token_hex(8)}", tenant, calls, slots)
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


def release(db: sqlite3.Connection, reservation: Reservation, *, refund: bool) -> None:
    """The reservation's slots go back (and its starts too when `refund`)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("DELETE FROM reservations WHERE id = ?", (reservation.id,))
        if refund:
            db.execute("DELETE FROM call_starts WHERE reservation = ?", (reservation.id,))
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
