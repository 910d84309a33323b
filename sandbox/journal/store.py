"""The journal: an append-only SQLite log (WAL) of every stage of every call, and the approvals.

Event writes do not wait on the event loop: :meth:`Journal.append` queues them, a writer thread
commits them in batches (or the barrier itself when nothing else writes, never waiting for a lock;
see writer.py), and :meth:`Journal.commit` is the barrier a call awaits
before it runs, so a crash (kill -9) never loses the record of a call that ran, and a journal
that cannot be written fails the call instead of letting it run unrecorded. Reads and the
approval writes stay synchronous: they first write whatever is queued, on the same connection
under the same lock, so they never miss a queued event nor race the writer.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from sandbox._sqlite_files import private_files, use_wal
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.approvals import Approval, ApprovalStore
from sandbox.journal.calls import CallRecord, CallRecords, State
from sandbox.journal.loops import LoopHistory
from sandbox.journal.notes import NotesMixin
from sandbox.journal.owners import LEASE_S, current_owner, owner_alive
from sandbox.journal.prune_steps import PruneStopped
from sandbox.journal.queries import Event, EventPage
from sandbox.journal.reads import ReadsMixin, damaged, damaged_message
from sandbox.journal.redact import redact
from sandbox.journal.retention import PruneReport, Retention, prune
from sandbox.journal.schema import (
    ADOPT_GRACE_S,
    DELETE_OPEN,
    DURABLE_STAGES,
    INSERT_EVENT,
    SETTLED,
    TERMINAL,
    UPSERT_LEASE,
    UPSERT_OPEN,
    migrate,
)
from sandbox.journal.writer import Statement, Writer

__all__ = ["Approval", "Event", "EventPage", "Journal"]

T = TypeVar("T")
WAL_LIMIT_BYTES = 64 * 1024 * 1024


def check_journal(path: Path) -> None:
    """Open the journal at `path` (migrating it), read it once and close it: a start-up check.

    Raises:
        SandboxError: the journal cannot be opened or read, with the file and the fix.
    """
    journal = Journal(path)
    try:
        journal.ping()
    finally:
        journal.close()


class Journal(ReadsMixin, NotesMixin):
    """SQLite journal in the state dir (WAL mode; one connection, serialized).

    One facade over four stores: the event store (this class: appends, commits, prune; with
    its reads, reads.py, and notes, notes.py), the approval store (`approval_store`,
    approvals.py), the loop-history store (`loop_history`, loops.py) and the call records
    (`call_records`, calls.py: call handles and idempotency keys). Their methods are the
    journal's own too, so callers name the journal only.

    Args:
        path: the database file.
        busy_timeout_s: how long a write waits for another process's lock before it fails.
    """

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self.path = path
        self.approval_store = ApprovalStore(self)
        self.loop_history = LoopHistory(self)
        self.call_records = CallRecords(self)
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._ping_lock = threading.Lock()  # pings wait only for each other (microseconds)
        self._busy_timeout_s = busy_timeout_s
        self._pending: dict[str, list[tuple[Any, ...]]] = {}
        self._closed = False
        self._mine: set[str] = set()  # calls this process has open (its lease is renewed meanwhile)
        self._heartbeat: threading.Thread | None = None
        self._stop = threading.Event()
        db: sqlite3.Connection | None = None
        try:
            private_files(path)
            fresh = path.stat().st_size == 0
            self._db = db = sqlite3.connect(
                str(path), timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
            )
            if fresh:  # only before the first page is written: lets retention give space back in steps
                self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            use_wal(self._db, busy_timeout_s)
            self._db.execute("PRAGMA synchronous=NORMAL")  # a process crash loses nothing committed
            # the log is truncated back to this after a checkpoint (a big prune would leave it large)
            self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            migrate(self._db, str(path))
            # reads get their own connection: in WAL mode they never wait for the writer thread
            self._reader = sqlite3.connect(
                str(path), timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
            )
            self._reader.execute("PRAGMA query_only=ON")
            # and the readiness probe its own: it never waits behind a page read (nor a write)
            self._pinger = sqlite3.connect(
                str(path), timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
            )
            self._pinger.execute("PRAGMA query_only=ON")
            private_files(path)  # the -wal and -shm files exist now
        except (sqlite3.Error, OSError, SandboxError) as exc:
            if db is not None:
                db.close()
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(ErrorCode.INTERNAL, damaged_message(path, exc)) from exc
        self._writer = Writer(self._db, self._lock, path.name, round(busy_timeout_s * 1000))
        _OPEN.add(self)

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._renew, name="journal-lease", daemon=True)
            self._heartbeat.start()

    def _renew(self) -> None:
        # a long call writes nothing for minutes: its owner's lease must not lapse meanwhile
        while not self._stop.wait(LEASE_S / 3):
            if not self._mine:
                continue
            with contextlib.suppress(sqlite3.Error), self._lock:
                self._db.execute(UPSERT_LEASE, (current_owner(), time.time() + LEASE_S))

    # -- the approval store's and the loop-history store's methods, as the journal's own ----

    def add_approval(self, approval: Approval) -> None:
        """Record a pending approval with its exact arguments (:meth:`ApprovalStore.add_approval`)."""
        self.approval_store.add_approval(approval)

    def decide(self, approval_id: str, status: str, reason: str = "") -> Approval:
        """Decide a pending approval; exactly one decision wins (:meth:`ApprovalStore.decide`)."""
        return self.approval_store.decide(approval_id, status, reason)

    def approval(self, approval_id: str, *, raw: bool = False) -> Approval | None:
        """One approval, or None (:meth:`ApprovalStore.approval`)."""
        return self.approval_store.approval(approval_id, raw=raw)

    def approvals(self, status: str | None = "pending", *, raw: bool = False) -> list[Approval]:
        """Approvals (pending by default), oldest first (:meth:`ApprovalStore.approvals`)."""
        return self.approval_store.approvals(status, raw=raw)

    def claim_call(self, record: CallRecord, *, keep_s: float) -> CallRecord:
        """Record a call handle, or find its key's holder (:meth:`CallRecords.claim`)."""
        return self.call_records.claim(record, keep_s=keep_s)

    def call_record(self, call_id: str) -> CallRecord | None:
        """A call handle's record (:meth:`CallRecords.call_record`)."""
        return self.call_records.call_record(call_id)

    def set_call_state(self, call_id: str, state: State) -> None:
        """A call handle's new state (:meth:`CallRecords.set_state`)."""
        self.call_records.set_state(call_id, state)

    def end_call(
        self, call_id: str, state: Literal["finished", "abandoned"], result: str | None, reason: str = ""
    ) -> None:
        """A call handle's outcome (:meth:`CallRecords.end`)."""
        self.call_records.end(call_id, state, result, reason)

    def loop_add(self, tenant: str, session: str, tool: str, args: str, result: str) -> None:
        """Remember one finished call of a session (:meth:`LoopHistory.loop_add`)."""
        self.loop_history.loop_add(tenant, session, tool, args, result)

    def loop_recent(self, tenant: str, session: str, window: int) -> tuple[bool, list[tuple[str, str, str]]]:
        """Whether the breaker is tripped, and the last calls (:meth:`LoopHistory.loop_recent`)."""
        return self.loop_history.loop_recent(tenant, session, window)

    def loop_trip(self, tenant: str, session: str) -> None:
        """Trip a session's circuit breaker (:meth:`LoopHistory.loop_trip`)."""
        self.loop_history.loop_trip(tenant, session)

    def loop_reset(self, tenant: str, session: str) -> None:
        """Forget a session's loop history and reset its breaker (:meth:`LoopHistory.loop_reset`)."""
        self.loop_history.loop_reset(tenant, session)

    def call_alive(self, call_id: str) -> bool | None:
        """Whether the orchestrator running `call_id` still runs (None: the journal holds it open for nobody)."""
        rows = self._read(
            "SELECT o.owner, w.lease_until FROM open_calls o LEFT JOIN owners w ON w.owner = o.owner "
            "WHERE o.call_id = ?",
            (call_id,),
        )
        return owner_alive(rows[0][0], rows[0][1], time.time()) if rows else None

    def awaiting_adoption(self, call_id: str) -> bool:
        """Whether an open call is durable (its command runs on without its owner) and its owner
        went less than ADOPT_GRACE_S ago: the next orchestrator adopts it; nobody ends it meanwhile."""
        rows = self._read(
            "SELECT w.lease_until FROM open_calls o LEFT JOIN owners w ON w.owner = o.owner WHERE o.call_id = ?",
            (call_id,),
        )
        if not rows:
            return False
        marks = ",".join("?" * len(DURABLE_STAGES))
        durable = self._read(
            f"SELECT 1 FROM events WHERE call_id = ? AND stage IN ({marks}) LIMIT 1",  # noqa: S608 - placeholders
            (call_id, *sorted(DURABLE_STAGES)),
        )
        return bool(durable) and time.time() - float(rows[0][0] or 0) < ADOPT_GRACE_S

    def owned_here(self, call_id: str) -> bool:
        """Whether `call_id` is open in the journal and this process owns it."""
        rows = self._read("SELECT owner FROM open_calls WHERE call_id = ?", (call_id,))
        return bool(rows) and rows[0][0] == current_owner()

    def take_over(self, call_id: str, from_owner: str) -> bool:
        """Make this process the owner of an open call that `from_owner` held, in one statement:
        of several processes trying at once, one wins (engine/handover.py adopts by it)."""
        mine, now = current_owner(), time.time()
        try:
            with self._lock:
                self._writer.drain_locked()
                took = self._db.execute(
                    "UPDATE open_calls SET owner = ?, ts = ? WHERE call_id = ? AND owner = ?",
                    (mine, now, call_id, from_owner),
                ).rowcount
                if took == 1:
                    self._db.execute(UPSERT_LEASE, (mine, now + LEASE_S))
        except sqlite3.Error as exc:
            raise SandboxError(ErrorCode.INTERNAL, f"the journal at {self.path} cannot be written ({exc})") from exc
        if took == 1:
            self._mine.add(call_id)
            self._start_heartbeat()
        return took == 1

    def open_calls(self) -> list[tuple[str, str, str, bool]]:
        """(call id, owner, last stage, owner alive) of every call that has not ended."""
        rows = self._read(
            "SELECT o.call_id, o.owner, o.stage, w.lease_until FROM open_calls o "
            "LEFT JOIN owners w ON w.owner = o.owner ORDER BY o.ts",
            (),
        )
        now = time.time()
        return [(r[0], r[1], r[2], owner_alive(r[1], r[3], now)) for r in rows]

    def close(self) -> None:
        """Write what is queued, stop the writer thread and close the connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        _OPEN.discard(self)
        try:
            self._writer.close()
        finally:
            with self._lock:
                self._db.close()
            with self._read_lock:
                self._reader.close()
            with self._ping_lock:
                self._pinger.close()

    def flush(self) -> None:
        """Write everything queued, on this thread (a blocking barrier for synchronous callers)."""
        with self._lock:
            self._writer.drain_locked()

    async def commit(self, call_id: str | None = None) -> None:
        """Wait, without blocking the event loop, until every event queued so far is written.

        A call awaits this before its handler runs: its stages are then durable.

        Args:
            call_id: report a failed write of this call's events (others were logged).

        Raises:
            SandboxError: INTERNAL when the call's events could not be written (the call must
                not run).
        """
        await self._writer.wait()
        failed = self._writer.failure(call_id) if call_id is not None else None
        if failed is not None:
            raise SandboxError(
                ErrorCode.INTERNAL,
                # no path: this message reaches tenants (the path is in the writer's log line)
                f"the journal cannot be written ({failed.__class__.__name__}); the call was not run",
            ) from failed

    async def settle(self, call_id: str) -> None:
        """Wait, without blocking the event loop, until a finished call's events are written.

        Never raises: the call has run and its result must reach the caller; a failed write
        was logged (`journal_write_failed`).
        """
        await self._writer.wait()
        self._writer.failure(call_id)

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        try:
            with self._lock:
                self._writer.drain_locked()  # after what is queued: the file keeps the order of events
                self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise SandboxError(
                ErrorCode.INTERNAL,
                f"the journal at {self.path} cannot be written ({exc}); the call was not run",
            ) from exc

    def append(
        self,
        *,
        trace_id: str,
        call_id: str,
        session: str,
        tenant: str,
        agent: str,
        tool: str,
        stage: str,
        duration_ms: float | None = None,
        data: dict[str, Any] | None = None,
        commit: bool = True,
        owner: str | None = None,
    ) -> None:
        """Record one event (data is redacted first).

        `owner`: who the call belongs to from now on (default: this process). Recovery writes its
        notes for the owner that is gone, so that a note does not make the call look alive.

        With `commit=False` the event waits for the next committed one of the same call and goes
        into the same transaction. Inside an event loop a committed one is queued with them for
        the writer thread: await :meth:`commit` for it to be durable (a call does before it
        runs). Outside one it is written before this returns.

        Raises:
            SandboxError: INTERNAL when the journal is closed or (outside an event loop) cannot
                be written.
        """
        payload = json.dumps(redact(data), default=str) if data else "{}"
        row = (time.time(), trace_id, call_id, session, tenant, agent, tool, stage, duration_ms, payload)
        pending = self._pending.setdefault(call_id, [])
        pending.append(row)
        if not commit:
            return
        rows = self._pending.pop(call_id)
        now = time.time()
        mine = current_owner()
        owner = owner if owner is not None else mine
        if stage in TERMINAL or stage in SETTLED:
            tracking: Statement = (DELETE_OPEN, [(call_id,)])
            self._mine.discard(call_id)
        else:
            tracking = (UPSERT_OPEN, [(call_id, owner, stage, now)])
            if owner == mine:
                self._mine.add(call_id)
                self._start_heartbeat()
        lease = (UPSERT_LEASE, [(mine, now + LEASE_S)])
        try:
            self._writer.submit(call_id, ((INSERT_EVENT, rows), tracking, lease))
        except sqlite3.Error as exc:
            raise SandboxError(
                ErrorCode.INTERNAL,
                f"the journal at {self.path} cannot be written ({exc}); the call was not run",
            ) from exc

    def forget_pending(self, call_id: str) -> None:
        """Drop a finished call's bookkeeping: events that will never commit (it crashed inside
        the orchestrator), and a write failure nobody will ask about."""
        self._pending.pop(call_id, None)
        self._writer.failure(call_id)

    def _read(self, sql: str, args: tuple[Any, ...], *, flush: bool = True) -> list[tuple[Any, ...]]:
        try:
            if flush and not self._writer.idle():
                self.flush()  # a read sees every write queued before it (waits for one in progress)
            with self._read_lock:
                return self._reader.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            said = (
                damaged_message(self.path, exc, "read")
                if damaged(exc)
                else f"the journal at {self.path} cannot be read ({exc})"
            )
            raise SandboxError(ErrorCode.INTERNAL, said) from exc

    def _locked(self, step: Callable[[sqlite3.Connection], T]) -> T:
        """Run one step on the write connection after what is queued (a short transaction).

        Raises:
            PruneStopped: the journal was closed meanwhile (an abandoned prune's next step).
        """
        try:
            with self._lock:
                if self._closed:
                    raise PruneStopped
                self._writer.drain_locked()
                return step(self._db)
        except sqlite3.Error as exc:
            raise self._prune_failed(exc) from exc

    def _prune_failed(self, exc: sqlite3.Error) -> SandboxError:
        said = (
            damaged_message(self.path, exc, "pruned")
            if damaged(exc)
            else f"the journal at {self.path} cannot be pruned ({exc})"
        )
        return SandboxError(ErrorCode.INTERNAL, said)

    def prune(
        self,
        retention: Retention,
        *,
        vacuum: bool = False,
        now: float | None = None,
        stop: threading.Event | None = None,
    ) -> PruneReport:
        """Delete what `retention` no longer keeps, in short batches, and give the space back.

        Never an event of an open call or of a pending approval. See journal/retention.py. Only
        the deletes and vacuum steps hold the write lock; counts, sizes and the final checkpoint
        run on a connection of the prune's own.

        Args:
            retention: the bounds.
            vacuum: also run one full VACUUM when the journal cannot give space back in steps
                (a journal made before schema version 2): blocks every writer while it runs.
            now: the time ages count from (default: the clock).
            stop: set it (from another thread) to end the prune at most one batch later; the
                report then says `stopped`.

        Raises:
            SandboxError: INTERNAL when the journal cannot be written.
        """
        try:
            side = sqlite3.connect(str(self.path), timeout=self._busy_timeout_s, isolation_level=None)
            side.execute("PRAGMA query_only=ON")
        except sqlite3.Error as exc:
            raise self._prune_failed(exc) from exc

        def look(step: Callable[[sqlite3.Connection], T]) -> T:
            try:
                return step(side)
            except sqlite3.Error as exc:
                raise self._prune_failed(exc) from exc

        try:
            when = time.time() if now is None else now
            return prune(self._locked, look, self.path, retention, now=when, vacuum=vacuum, stop=stop)
        finally:
            side.close()


# queued writes of journals still open when the process exits (no close()) are written then
_OPEN: weakref.WeakSet[Journal] = weakref.WeakSet()


@atexit.register
def _flush_open_journals() -> None:
    for journal in list(_OPEN):
        with contextlib.suppress(Exception):  # exiting: a journal that cannot be written was logged
            journal.flush()
