"""The PostgreSQL state store: a pool of async connections, the owner's lease renewed while open,
and one LISTEN connection that wakes approval waiters (see protocol.py for the contract)."""

from __future__ import annotations

import contextlib
import importlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
from loguru import logger

from sandbox.config.state import StateUrl
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.calls import CallRecord, State
from sandbox.journal.owners import owner_alive, owner_here
from sandbox.state.migrate import check_version
from sandbox.state.postgres import approvals, calls, quotas
from sandbox.state.postgres.connect import (
    CONNECT_TIMEOUT_S,
    KEEPALIVES,
    close_shielded,
    connect,
    psycopg_module,
    unreachable,
)
from sandbox.state.postgres.listen import Wakeups
from sandbox.state.postgres.schema import current_version
from sandbox.state.postgres.shared_rows import SharedRowsMixin
from sandbox.state.protocol import Approval, QuotaLimits, Refused, Reservation

POOL_OPEN_S = 10.0
CHECKOUT_S = 5.0  # a call waits at most this for a pooled connection (an outage: SERVICE_UNAVAILABLE then)
READ_AGAIN_S = 0.5  # a waiter whose read failed reads again after this (only while reads fail)
RENEW_AGAIN_S = 1.0  # after a missed renewal, the next try comes this soon
ORPHAN_PAGES = 10  # pages of other owners' running records looked at per pass
UNTRACK_S = 5.0  # a call's record removal waits at most this (shielded): then retried later
# every statement and lock wait of a pooled connection is bounded: a stalled or locked store
# fails a call with SERVICE_UNAVAILABLE instead of hanging it
STATEMENT_TIMEOUT_MS = 15_000
LOCK_TIMEOUT_MS = 5_000


class PostgresStore(SharedRowsMixin):
    """The shared store of several replicas (use :func:`open_postgres`).

    Args:
        url: the store.
        pool: an open psycopg_pool.AsyncConnectionPool (autocommit connections).
        owner: this process's owner identity.
        lease_s: how long its reservations count after it stops renewing.
    """

    kind: Literal["sqlite", "postgresql"] = "postgresql"

    def __init__(self, url: StateUrl, pool: Any, owner: str, lease_s: float) -> None:
        self.url = url
        self.owner = owner
        self.lease_s = lease_s
        self._pool = pool
        self._pg = psycopg_module()
        self.wakeups = Wakeups(url, approvals.CHANNEL)
        # reservations whose give-back failed (the store did not answer): retried with each lease
        # renewal, so a slot is never held for good by a replica that is alive
        self._unreleased: dict[str, tuple[Reservation, bool]] = {}
        self._gone_owner: dict[str, str] = {}  # call id -> the gone owner it was found with (orphans)
        self._steady_since: float | None = time.monotonic()  # renewed without a miss since (monotonic)
        self._untrack_later: set[str] = set()  # unkeyed records whose removal failed: retried
        self._unreleased_makes: set[str] = set()  # sandbox makes whose release failed: retried
        self._unclosed: list[tuple[str, list[str]]] = []  # session closes that failed: retried

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        """A pooled connection; a failure of the server is SERVICE_UNAVAILABLE, never a traceback."""
        pool_errors = importlib.import_module("psycopg_pool").PoolTimeout
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (self._pg.Error, pool_errors) as exc:
            raise unreachable(self.url, exc) from exc

    async def ping(self) -> None:
        """See :class:`~sandbox.state.protocol.StateStore`."""
        async with self._conn() as conn:
            await conn.execute("SELECT 1")

    async def reserve(
        self, tenant: str, limits: QuotaLimits, *, calls: int = 1, slots: int = 1, session: str | None = None
    ) -> Reservation | Refused:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        async with self._conn() as conn:
            return await quotas.reserve(conn, self.owner, self.lease_s, tenant, limits, calls, slots, session)

    async def confirm_session(self, reservation: Reservation, limit: int) -> bool:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        async with self._conn() as conn:
            return await quotas.confirm_session(conn, reservation, limit)

    async def release(self, reservation: Reservation) -> None:
        """See :class:`~sandbox.state.protocol.QuotaStore`; when the store does not answer, the
        release raises and is retried in the background until it does."""
        await self._give_back(reservation, refund=False)

    async def refund(self, reservation: Reservation) -> None:
        """See :meth:`release`."""
        await self._give_back(reservation, refund=True)

    async def _give_back(self, reservation: Reservation, *, refund: bool) -> None:
        try:
            async with self._conn() as conn:
                await quotas.release(conn, reservation, refund=refund)
        except SandboxError:
            self._unreleased[reservation.id] = (reservation, refund)
            raise
        self._unreleased.pop(reservation.id, None)

    async def _retry_give_backs(self) -> None:
        for reservation, refund in list(self._unreleased.values()):
            with contextlib.suppress(SandboxError):  # still down: the next renewal tries again
                await self._give_back(reservation, refund=refund)

    async def in_flight(self, tenant: str) -> int:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        async with self._conn() as conn:
            return await quotas.in_flight(conn, tenant)

    async def renew_lease(self) -> None:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        async with self._conn() as conn:
            await quotas.renew(conn, self.owner, self.lease_s)

    async def add_approval(self, approval: Approval) -> None:
        """See :class:`~sandbox.state.protocol.ApprovalStore`."""
        async with self._conn() as conn:
            await approvals.add(conn, approval)

    async def decide(self, approval_id: str, status: str, reason: str = "") -> Approval:
        """See :class:`~sandbox.state.protocol.ApprovalStore`."""
        async with self._conn() as conn:
            return await approvals.decide(conn, approval_id, status, reason)

    async def approval(self, approval_id: str, *, raw: bool = False) -> Approval | None:
        """See :class:`~sandbox.state.protocol.ApprovalStore`."""
        async with self._conn() as conn:
            return await approvals.one(conn, approval_id, raw)

    async def approvals(self, status: str | None = "pending", *, raw: bool = False) -> list[Approval]:
        """See :class:`~sandbox.state.protocol.ApprovalStore`."""
        async with self._conn() as conn:
            return await approvals.many(conn, status, raw)

    async def wait_decided(self, approval_id: str, timeout_s: float) -> Approval | None:
        """See :class:`~sandbox.state.protocol.ApprovalStore`: woken by NOTIFY, never polling."""
        with anyio.move_on_after(timeout_s):
            while True:
                event = self.wakeups.watch(approval_id)  # before the read: a NOTIFY after it still wakes
                try:
                    try:
                        current = await self.approval(approval_id)
                    except SandboxError:
                        # the store failed this read (an outage): read again soon, only while it fails,
                        # since the notification of a decision made meanwhile may be gone
                        with anyio.move_on_after(READ_AGAIN_S):
                            await event.wait()
                        continue
                    if current is None or current.status != "pending":
                        return current
                    await event.wait()
                finally:
                    self.wakeups.unwatch(approval_id, event)
        return None

    async def claim_call(self, record: CallRecord, *, keep_s: float) -> CallRecord:
        """See :class:`~sandbox.state.protocol.CallStore`."""
        async with self._conn() as conn:
            return await calls.claim(conn, record, keep_s, self.owner, self.lease_s, settle=self.steady())

    async def track_call(self, record: CallRecord) -> None:
        """See :class:`~sandbox.state.protocol.TrackedCalls`."""
        async with self._conn() as conn:
            await calls.track(conn, record, self.owner, self.lease_s)

    async def untrack_call(self, call_id: str) -> None:
        """See :class:`~sandbox.state.protocol.TrackedCalls`: a removal the store missed is
        retried with each lease renewal (a live replica's lease would keep the record for good)."""
        try:
            with anyio.fail_after(UNTRACK_S):
                async with self._conn() as conn:
                    await calls.untrack(conn, call_id, self.owner)
        except (SandboxError, TimeoutError) as exc:
            self._untrack_later.add(call_id)
            raise SandboxError(ErrorCode.SERVICE_UNAVAILABLE, f"the call's record stays for now: {exc}") from exc
        self._untrack_later.discard(call_id)

    async def _retry_untracks(self) -> None:
        for call_id in list(self._untrack_later):
            with contextlib.suppress(SandboxError):
                await self.untrack_call(call_id)

    async def note_durable(self, call_id: str, data: dict[str, Any]) -> None:
        """See :class:`~sandbox.state.protocol.CallStore`."""
        async with self._conn() as conn:
            await calls.note_durable(conn, call_id, json.dumps(data))

    async def orphans(self) -> list[tuple[CallRecord, dict[str, Any] | None]]:
        """See :class:`~sandbox.state.protocol.CallStore`: another owner's running records whose
        owner is gone; each with its owner noted for :meth:`adopt_call`.

        Gone means: a process of this host the kernel says is dead (whatever its lease), or an
        owner elsewhere whose lease ran out while this store has renewed its own, without a
        miss, for a whole lease: after an outage of the store every lease looks run out, and
        the other replicas must get the time to renew theirs before anybody takes their calls.
        Read in pages, so records this process cannot settle never hide the ones after them.
        """
        found: list[tuple[CallRecord, dict[str, Any] | None]] = []
        self._gone_owner = {}
        after: tuple[float, str] | None = None
        for _ in range(ORPHAN_PAGES):
            async with self._conn() as conn:
                rows = await calls.running_elsewhere(conn, self.owner, after)
            for record, owner, durable, leased in rows:
                if self._gone(owner, leased):
                    self._gone_owner[record.call_id] = owner
                    found.append((record, json.loads(durable) if durable else None))
            if len(rows) < calls.ORPHAN_BATCH:
                break
            after = (rows[-1][0].created, rows[-1][0].call_id)
        return found

    def _gone(self, owner: str, leased: bool) -> bool:
        process = owner.rsplit("|", 1)[0]  # journal/owners.py's identity, less the store's token
        if owner_here(process):  # the kernel knows, whatever an outage did to the lease
            return not owner_alive(process, None, time.time())
        return not leased and self.steady()

    def steady(self) -> bool:
        """Whether this store has renewed its lease without a miss for a whole lease."""
        return self._steady_since is not None and time.monotonic() - self._steady_since >= self.lease_s

    async def adopt_call(self, call_id: str) -> bool:
        """See :class:`~sandbox.state.protocol.CallStore`: only a record whose owner was found
        gone (:meth:`orphans`, or this process's own earlier incarnation), in one statement."""
        gone = self._gone_owner.pop(call_id, None)
        if gone is None:  # not looked at yet (a restart adopting what its journal shows open)
            await self.orphans()
            gone = self._gone_owner.pop(call_id, None)
            if gone is None:
                return False  # a live replica's, ended, or not there
        async with self._conn() as conn:
            return await calls.adopt(conn, call_id, gone, self.owner, self.lease_s)

    async def set_call_state(self, call_id: str, state: State) -> None:
        """See :class:`~sandbox.state.protocol.CallStore`."""
        async with self._conn() as conn:
            await calls.set_state(conn, call_id, state)

    async def end_call(
        self, call_id: str, state: Literal["finished", "abandoned"], result: str | None, reason: str = ""
    ) -> None:
        """See :class:`~sandbox.state.protocol.CallStore`."""
        async with self._conn() as conn:
            await calls.end(conn, call_id, state, result, reason, self.owner)

    async def call_record(self, call_id: str) -> CallRecord | None:
        """See :class:`~sandbox.state.protocol.CallStore`."""
        async with self._conn() as conn:
            return await calls.one(conn, call_id)

    async def wait_call(self, call_id: str, timeout_s: float) -> CallRecord | None:
        """See :class:`~sandbox.state.protocol.CallStore`: woken by NOTIFY; besides, every half
        lease it looks whether the replica running the call is gone (nothing would NOTIFY then)."""
        found: CallRecord | None = None
        with anyio.move_on_after(timeout_s):
            while True:
                event = self.wakeups.watch(call_id)  # before the read: a NOTIFY after it still wakes
                try:
                    try:
                        async with self._conn() as conn:
                            # right after an outage every lease looks run out: then only a dropped one counts
                            await calls.settle_gone(conn, call_id, trust_leases=self.steady())
                            found = await calls.one(conn, call_id)
                    except SandboxError:  # an outage: read again soon, only while reads fail
                        with anyio.move_on_after(READ_AGAIN_S):
                            await event.wait()
                        continue
                    if found is None or found.state in ("finished", "abandoned"):
                        return found
                    with anyio.move_on_after(self.lease_s / 2):
                        await event.wait()
                finally:
                    self.wakeups.unwatch(call_id, event)
        return found if found is not None else await self.call_record(call_id)

    async def _renew_forever(self) -> None:
        """Keep this owner's lease: a third of it between renewals, so one missed beat is
        harmless; after a miss, every second until the store answers (the lease must be back
        before another replica takes this one's calls for gone)."""
        while True:
            await anyio.sleep(self.lease_s / 3 if self._steady_since is not None else RENEW_AGAIN_S)
            try:
                await self.renew_lease()
            except SandboxError as exc:
                if self._steady_since is not None:
                    logger.bind(error=exc.message[:200]).warning("state_lease_not_renewed")
                self._steady_since = None
                continue
            if self._steady_since is None:
                self._steady_since = time.monotonic()
            await self._retry_give_backs()
            await self._retry_untracks()
            await self._retry_releases()


async def _open_pool(url: StateUrl, pool_max: int) -> Any:
    try:
        pool_module = importlib.import_module("psycopg_pool")
    except ImportError as exc:
        raise SandboxError(
            ErrorCode.SERVICE_UNAVAILABLE,
            "state.url names PostgreSQL, but psycopg-pool is not installed: pip install 'agent-sandbox[postgres]'",
        ) from exc
    pool = pool_module.AsyncConnectionPool(
        url.url,
        min_size=1,
        max_size=pool_max,
        timeout=CHECKOUT_S,
        open=False,
        # a connection the server ended (a failover, pg_terminate_backend) is replaced when
        # checked out, not handed to a caller: one empty round trip per checkout
        check=pool_module.AsyncConnectionPool.check_connection,
        kwargs={
            "autocommit": True,
            "connect_timeout": CONNECT_TIMEOUT_S,
            "application_name": "agent-sandbox",
            "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={LOCK_TIMEOUT_MS}",
            **KEEPALIVES,
        },
    )
    try:
        await pool.open(wait=True, timeout=POOL_OPEN_S)
    except (pool_module.PoolTimeout, psycopg_module().Error) as exc:
        await pool.close()
        raise unreachable(url, exc) from exc
    return pool


@asynccontextmanager
async def open_postgres(
    url: StateUrl, *, owner: str, lease_s: float, pool_max: int = 20
) -> AsyncIterator[PostgresStore]:
    """Open the store: reachable, credentials good, schema at this code's version.

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the server cannot be reached or refuses the
            login, or the schema is another version (with `sandbox state migrate` as the fix).
    """
    conn = await connect(url)
    try:
        version = await current_version(conn)
    except psycopg_module().Error as exc:
        raise unreachable(url, exc) from exc
    finally:
        await close_shielded(conn)
    check_version(url.shown, "postgresql", version)
    pool = await _open_pool(url, pool_max)
    store = PostgresStore(url, pool, owner, lease_s)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(store.wakeups.run)
            await store.renew_lease()  # at once: what this owner records must never look like a dead owner's
            tg.start_soon(store._renew_forever)
            try:
                yield store
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # the body's own error, not the task group's wrapping
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        with contextlib.suppress(SandboxError), anyio.CancelScope(shield=True):
            async with store._conn() as c:
                await quotas.drop_owner(c, owner)
        with anyio.CancelScope(shield=True):
            await pool.close()
