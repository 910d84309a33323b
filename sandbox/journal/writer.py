"""The journal's writer: one thread commits queued writes in batches, off the event loop.

Inside an event loop, writers enqueue statement batches and move on; the thread takes
everything queued so far and commits it as one transaction (group commit: concurrent calls
share one commit). Whoever needs a write to be durable awaits :meth:`Writer.wait` (a barrier on
a sequence number). Synchronous readers call :meth:`Writer.drain_locked` under the connection
lock, so a read never misses a queued write and never runs beside the thread's transaction.
Outside an event loop a write is simply synchronous.

A barrier that finds nothing else writing commits the queue itself, on the caller's thread: a
call's few rows take about 0.1 ms, less than waking the thread and being woken by it. It never
waits there: the connection's lock is only tried, another process's lock is not waited for
(busy timeout 0 for that transaction), and any error gives the batches back to the thread, which
writes them with the normal timeout and reports failures. Checkpoints, the one step that can
take long (they copy the log into the database), never run on the caller's thread: that one
transaction runs with wal_autocheckpoint=0 (every other write, the thread's and a prune's, keeps
SQLite's own), and the thread runs one every CHECKPOINT_EVERY transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio.to_thread

from sandbox._log import logger

MAX_FAILURES = 1024  # failures kept for a barrier to report; older ones were logged and dropped
CHECKPOINT_EVERY = 200  # transactions between the thread's checkpoints (a few pages each)
AUTOCHECKPOINT_PAGES = 1000  # SQLite's own default: every other write (the thread's, a prune's) keeps it

Statement = tuple[str, list[tuple[Any, ...]]]  # SQL, and the rows it runs for (executemany)


@dataclass(frozen=True)
class Batch:
    """Statements that commit together, in order; `owner` is told if they fail (a call id)."""

    seq: int
    owner: str | None
    statements: tuple[Statement, ...]


class Writer:
    """A queue of batches, one thread that commits them, and barriers that wait for a commit.

    Args:
        db: the connection (shared with readers; every use holds `lock`).
        lock: the connection lock.
        name: for the thread's name and logs.
    """

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, name: str, busy_timeout_ms: int = 5000) -> None:
        self._db = db
        self._busy_timeout_ms = busy_timeout_ms
        self._since_checkpoint = 0  # transactions since the last checkpoint
        self._lock = lock
        self._name = name
        self._cond = threading.Condition()  # guards the queue, the counters and the waiters
        self._queue: deque[Batch] = deque()
        self._seq = 0  # the last sequence number handed out
        self._done = 0  # every batch up to here is written (or failed and recorded)
        self._failures: OrderedDict[str, sqlite3.Error] = OrderedDict()
        self._waiters: list[tuple[int, Callable[[], None]]] = []
        self._thread: threading.Thread | None = None
        self._closing = False
        self._writing = 0  # batches taken from the queue and not yet committed (or failed)
        self.transactions = 0  # committed so far (group commit makes this fewer than batches)
        self.checkpoints = 0  # run so far (by the thread, or by synchronous writes)

    def backlog(self) -> int:
        """Batches queued and not yet written."""
        with self._cond:
            return len(self._queue)

    def idle(self) -> bool:
        """Nothing queued and nothing being written: a read on another connection misses nothing."""
        with self._cond:
            return not self._queue and self._writing == 0

    def submit(self, owner: str | None, statements: tuple[Statement, ...]) -> None:
        """Queue one batch for the thread (inside an event loop), else write it now.

        Outside an event loop (a CLI command, a script) nothing would await a barrier, so the
        batch is written before this returns, as a plain synchronous write.

        Raises:
            sqlite3.Error: the journal is closed, or (written now) the write failed.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no asyncio loop in this thread (another anyio backend also lands here)
            with self._lock:
                self.drain_locked()
                self._transaction([Batch(0, owner, statements)])
                self._checkpoint_if_due()  # no loop to keep free here
            return
        with self._cond:
            if self._closing:
                raise sqlite3.ProgrammingError("the journal is closed")
            self._seq += 1
            self._queue.append(Batch(self._seq, owner, statements))
            if self._thread is None:  # started on the first write: readers never pay for a thread
                self._thread = threading.Thread(target=self._run, name=f"journal-writer:{self._name}", daemon=True)
                self._thread.start()
            self._cond.notify()

    def failure(self, owner: str) -> sqlite3.Error | None:
        """The error of the owner's failed batch (reported once), or None."""
        with self._cond:
            return self._failures.pop(owner, None)

    async def wait(self) -> None:
        """Wait, without blocking the event loop, until every batch queued so far is written."""
        with self._cond:
            target = self._seq
            if self._done >= target:
                return
        self._commit_here()  # nearly always writes it, here; otherwise the thread does
        with self._cond:
            if self._done >= target:
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # another anyio backend: a worker thread waits instead
                loop = None
            if loop is not None:
                # the cheapest wake-up from a thread: one call_soon_threadsafe, no worker thread
                future: asyncio.Future[None] = loop.create_future()

                def wake() -> None:
                    if not future.done():
                        future.set_result(None)

                def notify() -> None:
                    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                        loop.call_soon_threadsafe(wake)

                self._waiters.append((target, notify))
        if loop is not None:
            await future
        else:
            await anyio.to_thread.run_sync(self._wait_sync, target, abandon_on_cancel=True)

    def _wait_sync(self, target: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._done >= target)

    def _commit_here(self) -> bool:
        """Commit everything queued on this thread when nothing else writes and no other process
        holds the database; True when it did (False: the thread writes it, as without this)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            with self._cond:
                if self._writing or self._closing or not self._queue:
                    return False
                batches = list(self._queue)
                self._queue.clear()
                self._writing += len(batches)
            try:
                self._db.execute("PRAGMA busy_timeout=0")  # another process's lock: not waited for here
                self._db.execute("PRAGMA wal_autocheckpoint=0")  # nor a checkpoint: the thread runs those
                self._transaction(batches)
            except sqlite3.Error:
                with self._cond:  # back to the front, in order: the thread writes them (or reports why not)
                    self._queue.extendleft(reversed(batches))
                    self._writing -= len(batches)
                    self._cond.notify()
                return False
            finally:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
                    self._db.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            with self._cond:
                self._writing -= len(batches)
                if self._since_checkpoint >= CHECKPOINT_EVERY:
                    self._cond.notify()  # the thread checkpoints, off this thread
            self._settle(batches, [])
            return True
        finally:
            self._lock.release()

    def drain_locked(self) -> None:
        """Write everything queued now, on this thread; the caller holds the connection lock."""
        with self._cond:
            if not self._queue:
                return
            batches = list(self._queue)
            self._queue.clear()
            self._writing += len(batches)
        try:
            failed = self._commit(batches)
        finally:
            with self._cond:
                self._writing -= len(batches)
        self._settle(batches, failed)

    def _settle(self, batches: list[Batch], failed: list[tuple[Batch, sqlite3.Error]]) -> None:
        """Record what failed, move the written mark past `batches`, wake their barriers."""
        with self._cond:
            for batch, exc in failed:
                if batch.owner is not None:
                    self._failures[batch.owner] = exc
                    self._failures.move_to_end(batch.owner)
                    while len(self._failures) > MAX_FAILURES:
                        self._failures.popitem(last=False)
            self._done = max(self._done, batches[-1].seq)
            ready = [w for w in self._waiters if w[0] <= self._done]
            self._waiters = [w for w in self._waiters if w[0] > self._done]
            self._cond.notify_all()
        for _, notify in ready:
            notify()

    def close(self) -> None:
        """Write what is queued and stop the thread (idempotent)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            self.drain_locked()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: bool(self._queue) or self._closing or self._since_checkpoint >= CHECKPOINT_EVERY
                )
                if not self._queue and self._closing:
                    return
            with self._lock:
                self.drain_locked()
                self._checkpoint_if_due()

    def _checkpoint_if_due(self) -> None:
        """Copy the log into the database (PASSIVE: never waits for readers) every CHECKPOINT_EVERY
        transactions; the caller holds the connection lock."""
        if self._since_checkpoint < CHECKPOINT_EVERY:
            return
        self._since_checkpoint = 0
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            self.checkpoints += 1
        except sqlite3.Error as exc:  # the next one tries again; the log only grows meanwhile
            logger.bind(journal=self._name, reason=str(exc)).warning("journal_checkpoint_failed")

    def _commit(self, batches: list[Batch]) -> list[tuple[Batch, sqlite3.Error]]:
        """One transaction for all. When it fails, each batch is retried alone so only a bad one
        fails; but a busy or locked database, or a closed connection, fails them all at once
        rather than waiting the busy timeout once per batch."""
        try:
            self._transaction(batches)
            return []
        except sqlite3.Error as exc:
            if len(batches) == 1 or _whole_database(exc):
                return self._failed(batches, exc)
        failed = []
        for batch in batches:
            try:
                self._transaction([batch])
            except sqlite3.Error as exc:
                failed += self._failed([batch], exc)
        return failed

    def _failed(self, batches: list[Batch], exc: sqlite3.Error) -> list[tuple[Batch, sqlite3.Error]]:
        for batch in batches:
            logger.bind(journal=self._name, owner=batch.owner, reason=str(exc)).error("journal_write_failed")
        return [(batch, exc) for batch in batches]

    def _transaction(self, batches: list[Batch]) -> None:
        db = self._db
        try:
            db.execute("BEGIN")
            for batch in batches:
                for sql, rows in batch.statements:
                    db.executemany(sql, rows)
            db.execute("COMMIT")
            self.transactions += 1
            self._since_checkpoint += 1
        except Exception as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise
            # a bug (a row that cannot bind) must fail its batch, not kill the thread and its waiters
            raise sqlite3.InterfaceError(f"{exc.__class__.__name__}: {exc}") from exc


def _whole_database(exc: sqlite3.Error) -> bool:
    """An error of the database, not of one statement: SQLITE_BUSY, SQLITE_LOCKED, or closed."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.ProgrammingError) or (code is not None and code & 0xFF in (5, 6))
