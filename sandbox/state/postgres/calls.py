"""Call records on PostgreSQL (the CallStore of sandbox/state/protocol.py): a key is claimed by
one INSERT against the partial unique index, so of any number of replicas asking at once one
wins and the others read its record; a call's end sends NOTIFY (the store's wake-up channel,
the call id as payload) in the same transaction, so a waiter on any replica wakes when it commits."""

from __future__ import annotations

from typing import Any, Literal

from sandbox.journal.calls import STALE_S, CallRecord, State, values
from sandbox.state.postgres import quotas
from sandbox.state.postgres.approvals import CHANNEL

COLUMNS = "call_id, tenant, session, agent, tool, idem_key, fingerprint, state, result, reason, created, ended"
NOW = "extract(epoch from clock_timestamp())"
# a running call whose replica's lease ran out (or that stopped and dropped its lease) is over;
# a durable one's command runs on (engine/handover.py): it is adopted by another replica, not ended
GONE = (
    "state NOT IN ('finished', 'abandoned') AND durable IS NULL AND NOT EXISTS "
    "(SELECT 1 FROM owners o WHERE o.owner = calls.owner AND o.lease_until >= extract(epoch from clock_timestamp()))"
)
# right after an outage of the store every lease looks run out: only a replica that dropped its
# lease (it stopped) is then taken for gone (PostgresStore.steady says when leases are trusted)
GONE_DROPPED = (
    "state NOT IN ('finished', 'abandoned') AND durable IS NULL AND NOT EXISTS "
    "(SELECT 1 FROM owners o WHERE o.owner = calls.owner)"
)
ORPHAN_BATCH = 100  # running records of other owners looked at per pass
GONE_REASON = "its replica went away (its lease ran out) before it finished; not re-run"


def _record(row: tuple[Any, ...]) -> CallRecord:
    return CallRecord(
        call_id=row[0],
        tenant=row[1],
        session=row[2],
        agent=row[3],
        tool=row[4],
        idempotency_key=row[5],
        fingerprint=row[6],
        state=row[7],
        result=row[8],
        reason=row[9],
        created=float(row[10]),
        ended=None if row[11] is None else float(row[11]),
    )


async def claim(
    conn: Any, record: CallRecord, keep_s: float, owner: str, lease_s: float, *, settle: bool = True
) -> CallRecord:
    """Record `record` as `owner`'s, or return the live record that holds its key (see the
    module docstring). What the key's lifetime no longer keeps goes first: ended records, and an
    expired holder; a holder whose replica is gone is ended as abandoned."""
    async with conn.transaction():
        await quotas.renew(conn, owner, lease_s)  # this owner's lease: the record's liveness
        # a key is kept `keep_s` after its call ENDED; a running call's is never freed (it would
        # run twice), except one left running past STALE_S (its replica died unseen)
        await conn.execute(
            "DELETE FROM calls WHERE (state IN ('finished', 'abandoned') "
            "AND ended < extract(epoch from clock_timestamp()) - %s) "
            "OR created < extract(epoch from clock_timestamp()) - %s",
            (keep_s, max(keep_s, STALE_S)),
        )
        cur = await conn.execute(
            f"INSERT INTO calls ({COLUMNS}, owner) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {NOW}, NULL, %s) "  # noqa: S608
            f"ON CONFLICT (tenant, idem_key) WHERE idem_key IS NOT NULL DO NOTHING RETURNING {COLUMNS}",
            (*values(record), owner),
        )
        mine = await cur.fetchone()
        if mine is not None:
            return _record(mine)
        await _end_gone(conn, "tenant = %s AND idem_key = %s", (record.tenant, record.idempotency_key), settle)
        cur = await conn.execute(  # the holder (read committed: its row is visible now)
            f"SELECT {COLUMNS} FROM calls WHERE tenant = %s AND idem_key = %s",  # noqa: S608 - constant columns
            (record.tenant, record.idempotency_key),
        )
        held = await cur.fetchone()
    assert held is not None  # the conflict was with this row
    return _record(held)


async def track(conn: Any, record: CallRecord, owner: str, lease_s: float) -> None:
    """Record a running unkeyed call of `owner`, renewing its lease in the same statement (one
    round trip: this is on every call's path)."""
    await conn.execute(
        f"WITH lease AS (INSERT INTO owners (owner, lease_until) VALUES (%s, {NOW} + %s) "  # noqa: S608 - constants
        "ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until) "
        f"INSERT INTO calls ({COLUMNS}, owner) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {NOW}, NULL, %s)",
        (owner, lease_s, *values(record), owner),
    )


async def untrack(conn: Any, call_id: str, owner: str) -> None:
    """Delete an unkeyed call's record when it ended on its owner (another's adoption stays)."""
    await conn.execute("DELETE FROM calls WHERE call_id = %s AND owner = %s", (call_id, owner))


async def set_state(conn: Any, call_id: str, state: State) -> None:
    """A running call's new state (never over an ended one)."""
    await conn.execute(
        "UPDATE calls SET state = %s WHERE call_id = %s AND state NOT IN ('finished', 'abandoned')", (state, call_id)
    )


async def end(
    conn: Any, call_id: str, state: Literal["finished", "abandoned"], result: str | None, reason: str, owner: str
) -> None:
    """The call's outcome, and the wake-up of its waiters everywhere: only by its owner, and
    only once (a replica taken for gone that ends it after another adopted it changes nothing)."""
    async with conn.transaction():
        await conn.execute(
            f"UPDATE calls SET state = %s, result = %s, reason = %s, ended = {NOW} WHERE call_id = %s "  # noqa: S608
            "AND owner = %s AND state NOT IN ('finished', 'abandoned')",
            (state, result, reason, call_id, owner),
        )
        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, call_id))


async def note_durable(conn: Any, call_id: str, data: str) -> None:
    """What another replica needs to adopt the call's command (JSON: its process id, timeout,
    trace and start): a durable record is adopted when its replica is gone, never ended so."""
    await conn.execute("UPDATE calls SET durable = %s WHERE call_id = %s", (data, call_id))


async def running_elsewhere(
    conn: Any, owner: str, after: tuple[float, str] | None = None
) -> list[tuple[CallRecord, str, str | None, bool]]:
    """(record, its owner, its durable JSON, whether the owner's lease runs) of running records
    another owner holds, oldest first, ORPHAN_BATCH of them after `after` (created, call id):
    the caller decides which owners are gone and pages on."""
    live = f"EXISTS (SELECT 1 FROM owners o WHERE o.owner = calls.owner AND o.lease_until >= {NOW})"  # noqa: S608
    host = "|".join(owner.split("|")[:2]) + "|%"  # this host since its boot: the kernel can tell
    page = "" if after is None else "AND (created, call_id) > (%s, %s) "
    cur = await conn.execute(
        f"SELECT {COLUMNS}, calls.owner, durable, {live} FROM calls "  # noqa: S608 - constant text
        "WHERE state NOT IN ('finished', 'abandoned') AND calls.owner <> %s "
        f"AND (NOT {live} OR calls.owner LIKE %s) {page}ORDER BY created, call_id LIMIT %s",
        (owner, host, *(after or ()), ORPHAN_BATCH),
    )
    return [(_record(row), row[12], row[13], bool(row[14])) for row in await cur.fetchall()]


async def adopt(conn: Any, call_id: str, gone_owner: str, owner: str, lease_s: float) -> bool:
    """Make `owner` (this replica) the owner of a running record while `gone_owner` still holds
    it: one statement, so of replicas adopting at once one wins; False otherwise."""
    async with conn.transaction():
        await quotas.renew(conn, owner, lease_s)
        cur = await conn.execute(
            "UPDATE calls SET owner = %s WHERE call_id = %s AND owner = %s "
            "AND state NOT IN ('finished', 'abandoned') RETURNING 1",
            (owner, call_id, gone_owner),
        )
        return await cur.fetchone() is not None


async def _end_gone(conn: Any, where: str, args: tuple[Any, ...], trust_leases: bool = True) -> None:
    """End as abandoned the running records (matching `where`) whose replica is gone, waking
    their waiters (without `trust_leases`, only those whose replica dropped its lease)."""
    cur = await conn.execute(
        f"UPDATE calls SET state = 'abandoned', result = NULL, reason = %s, ended = {NOW} "  # noqa: S608 - constant
        f"WHERE {where} AND {GONE if trust_leases else GONE_DROPPED} RETURNING call_id",
        (GONE_REASON, *args),
    )
    for (call_id,) in await cur.fetchall():
        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, call_id))


async def settle_gone(conn: Any, call_id: str, trust_leases: bool = True) -> None:
    """End `call_id` as abandoned when it still runs on a replica that is gone."""
    async with conn.transaction():
        await _end_gone(conn, "call_id = %s", (call_id,), trust_leases)


async def one(conn: Any, call_id: str) -> CallRecord | None:
    """The record of `call_id`, or None."""
    cur = await conn.execute(f"SELECT {COLUMNS} FROM calls WHERE call_id = %s", (call_id,))  # noqa: S608 - constant columns
    row = await cur.fetchone()
    return None if row is None else _record(row)
