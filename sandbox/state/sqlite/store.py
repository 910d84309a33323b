"""The SQLite state store: `state.sqlite3` in state_dir, WAL, one connection used from worker
threads one call at a time (sqlite3 blocks; the event loop never waits on it).

SQLite has no NOTIFY: a decision made through this store wakes its waiters here at once, and a
waiter reads the row again every `POLL_S` for decisions made by another process.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal, TypeVar

import anyio
from loguru import logger

from sandbox._sqlite_files import private_files, use_wal
from sandbox.errors import ErrorCode, SandboxError
from sandbox.state.migrate import check_version
from sandbox.state.protocol import Approval, QuotaLimits, Refused, Reservation
from sandbox.state.sqlite import approvals, quotas
from sandbox.state.sqlite.schema import current_version, migrate

T = TypeVar("T")
FILE_NAME = "state.sqlite3"
POLL_S = 0.1


def connect(path: Path, *, busy_timeout_s: float = 5.0) -> sqlite3.Connection:
    """A connection to the store's file (made 0600 first), in autocommit mode, WAL.

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the file cannot be opened.
    """
    try:
        private_files(path)
        db = sqlite3.connect(str(path), timeout=busy_timeout_s, check_same_thread=False, isolation_level=None)
        use_wal(db, busy_timeout_s)
        db.execute("PRAGMA synchronous=NORMAL")
        private_files(path)  # the -wal and -shm files exist now
    except (sqlite3.Error, OSError) as exc:
        raise unusable(path, exc) from exc
    return db


def unusable(path: Path, exc: BaseException) -> SandboxError:
    """The error for a store file that cannot be read or written."""
    return SandboxError(ErrorCode.SERVICE_UNAVAILABLE, f"the state store at {path} cannot be used: {exc}")


class SqliteStore:
    """The embedded store (use :func:`open_sqlite`).

    Args:
        path: the database file.
        db: its connection (migrated).
        owner: this process's owner identity.
        lease_s: how long its reservations count after it stops renewing (other hosts only:
            on this host the kernel says whether the owner runs).
    """

    kind: Literal["sqlite", "postgresql"] = "sqlite"

    def __init__(self, path: Path, db: sqlite3.Connection, owner: str, lease_s: float) -> None:
        self.path = path
        self.owner = owner
        self.lease_s = lease_s
        self._db = db
        self._limiter = anyio.CapacityLimiter(1)  # one statement at a time on the one connection
        self._decided: dict[str, anyio.Event] = {}

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, self._db, *args), limiter=self._limiter)
        except sqlite3.Error as exc:
            raise unusable(self.path, exc) from exc

    async def ping(self) -> None:
        """See :class:`~sandbox.state.protocol.StateStore`."""
        await self._run(lambda db: db.execute("SELECT 1").fetchone())

    async def reserve(
        self, tenant: str, limits: QuotaLimits, *, calls: int = 1, slots: int = 1, session: str | None = None
    ) -> Reservation | Refused:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        return await self._run(quotas.reserve, self.owner, self.lease_s, tenant, limits, calls, slots, session)

    async def confirm_session(self, reservation: Reservation, limit: int) -> bool:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        return await self._run(quotas.confirm_session, reservation, limit)

    async def close_sessions(self, tenant: str, keys: list[str]) -> None:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        await self._run(quotas.close_sessions, tenant, keys)

    async def release(self, reservation: Reservation) -> None:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        await self._run(functools.partial(quotas.release, refund=False), reservation)

    async def refund(self, reservation: Reservation) -> None:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        await self._run(functools.partial(quotas.release, refund=True), reservation)

    async def in_flight(self, tenant: str) -> int:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        return await self._run(quotas.in_flight, tenant)

    async def renew_lease(self) -> None:
        """See :class:`~sandbox.state.protocol.QuotaStore`."""
        await self._run(quotas.renew, self.owner, self.lease_s)

    async def add_approval(self, approval: Approval) -> None:
        """See :class:`~sandbox.state.protocol.ApprovalStore`."""
        await self._run(approvals.add, approval)

    async def decide(self, approval_id: str, status: str, reason: str = "") -> Approval:
        """See :class:`~sandbox.state.protocol.ApprovalStore`."""
        decided = await self._run(approvals.decide, approval_id, status, reason)
        event = self._decided.get(approval_id)
        if event is not None:
            event.set()
        return decided

    async def approval(self, approval_id: str, *, raw: bool = False) -> Approval | None:
        """See :class:`~sandbox.state.protocol.ApprovalStore`."""
        return await self._run(approvals.one, approval_id, raw)

    async def approvals(self, status: str | None = "pending", *, raw: bool = False) -> list[Approval]:
        """See :class:`~sandbox.state.protocol.ApprovalStore`."""
        return await self._run(approvals.many, status, raw)

    async def wait_decided(self, approval_id: str, timeout_s: float) -> Approval | None:
        """See :class:`~sandbox.state.protocol.ApprovalStore` (this process: at once; others: polled)."""
        event = self._decided.setdefault(approval_id, anyio.Event())
        try:
            with anyio.move_on_after(timeout_s):
                while True:
                    current = await self.approval(approval_id)
                    if current is None or current.status != "pending":
                        return current
                    with anyio.move_on_after(POLL_S):
                        await event.wait()
        finally:
            self._decided.pop(approval_id, None)
        return None

    async def _renew_forever(self) -> None:
        while True:
            await anyio.sleep(self.lease_s / 3)
            try:
                await self.renew_lease()
            except SandboxError as exc:
                logger.bind(error=exc.message[:200]).warning("state_lease_not_renewed")


@asynccontextmanager
async def open_sqlite(path: Path, *, owner: str, lease_s: float) -> AsyncIterator[SqliteStore]:
    """Open (and migrate: embedded, nothing to run by hand) the store file at `path`.

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the file cannot be used or was written by a newer
            version of the code.
    """
    db = connect(path)
    try:
        try:
            migrate(db, str(path))
            check_version(str(path), "sqlite", current_version(db))
        except sqlite3.Error as exc:
            raise unusable(path, exc) from exc
        store = SqliteStore(path, db, owner, lease_s)
        try:
            async with anyio.create_task_group() as tg:
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
            with anyio.CancelScope(shield=True):
                try:
                    await store._run(quotas.drop_owner, owner)
                except SandboxError as exc:
                    logger.bind(error=exc.message[:200]).warning("state_owner_not_dropped")
    finally:
        db.close()
