"""The journal: an append-only SQLite log (WAL) of every stage of every call, and the approvals.

Event writes leave the event loop: :meth:`Journal.append` queues them for a writer thread that
commits in batches (see writer.py), and :meth:`Journal.commit` is the barrier a call awaits
before it runs, so a crash (kill -9) never loses the record of a call that ran, and a journal
that cannot be written fails the call instead of letting it run unrecorded. Reads and the
approval writes stay synchronous: they first write whatever is queued, on the same connection
under the same lock, so they never miss a queued event nor race the writer.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import sqlite3
import stat
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.owners import LEASE_S, current_owner, owner_alive
from sandbox.journal.queries import Event, EventPage, event_of
from sandbox.journal.queries import page as _page
from sandbox.journal.redact import redact
from sandbox.journal.schema import (
    DELETE_OPEN,
    INSERT_EVENT,
    INSERT_LOOP_CALL,
    SETTLED,
    TERMINAL,
    UPSERT_LEASE,
    UPSERT_OPEN,
    migrate,
)
from sandbox.journal.writer import Statement, Writer

__all__ = ["Approval", "Event", "EventPage", "Journal"]


@dataclass(frozen=True)
class Approval:
    """A call waiting for (or decided by) a human."""

    id: str
    call_id: str
    trace_id: str
    session: str
    agent: str
    tool: str
    # exactly what runs while pending (read with raw=True), masked once decided; see decide()
    arguments: dict[str, Any]
    status: str  # pending | approved | denied | expired
    reason: str
    created: float
    decided: float | None


class Journal:
    """SQLite journal in the state dir (WAL mode; one connection, serialized).

    Args:
        path: the database file.
        busy_timeout_s: how long a write waits for another process's lock before it fails.
    """

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._pending: dict[str, list[tuple[Any, ...]]] = {}
        self._closed = False
        self._mine: set[str] = set()  # calls this process has open (its lease is renewed meanwhile)
        self._heartbeat: threading.Thread | None = None
        self._stop = threading.Event()
        try:
            _private_files(path)
            self._db = sqlite3.connect(str(path), timeout=busy_timeout_s, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # a process crash loses nothing committed
            migrate(self._db, str(path))
            # reads get their own connection: in WAL mode they never wait for the writer thread
            self._reader = sqlite3.connect(
                str(path), timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
            )
            self._reader.execute("PRAGMA query_only=ON")
            _private_files(path)  # the -wal and -shm files exist now
        except (sqlite3.Error, OSError) as exc:
            raise SandboxError(ErrorCode.INTERNAL, f"the journal at {path} cannot be opened: {exc}") from exc
        self._writer = Writer(self._db, self._lock, path.name)
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
                f"the journal at {self.path} cannot be written ({failed}); the call was not run",
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

    def events(
        self,
        *,
        trace_id: str | None = None,
        session: str | None = None,
        call_id: str | None = None,
        after_id: int = 0,
        limit: int = 10_000,
        newest: bool = False,
    ) -> list[Event]:
        """Events in order, filtered: the first `limit`, or with `newest` the last `limit`."""
        where, args = ["id > ?"], [after_id]
        for column, value in (("trace_id", trace_id), ("session", session), ("call_id", call_id)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)  # type: ignore[arg-type]
        order = "DESC" if newest else "ASC"
        rows = self._read(
            f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY id {order} LIMIT ?",  # noqa: S608 - fixed words
            (*args, limit),
        )
        found = [event_of(row) for row in rows]
        return list(reversed(found)) if newest else found

    def page(
        self,
        *,
        tenant: str | None,
        session: str | None = None,
        trace_id: str | None = None,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> EventPage:
        """One page of events, newest first, reading only what it returns (O(limit) at any size).

        Args:
            tenant: only this tenant's events (inside the query: a busy neighbour never crowds
                a tenant's page); None for every tenant (the operator's view).
            session: only this session key.
            trace_id: only this trace.
            since: only events at or after this Unix time.
            until: only events at or before this Unix time.
            cursor: the `next_cursor` of the previous page; None for the newest page.
            limit: events per page, 1 to 10,000.

        Returns:
            the events and the cursor of the next (older) page, None when there is none.

        Raises:
            UsageError: a bad limit or cursor.
            SandboxError: INTERNAL when the journal cannot be read.
        """
        return _page(
            self._read,
            tenant=tenant,
            session=session,
            trace_id=trace_id,
            since=since,
            until=until,
            cursor=cursor,
            limit=limit,
        )

    def ping(self) -> None:
        """One trivial read of the file (for readiness probes: no integrity check, no count).

        Raises:
            SandboxError: SERVICE_UNAVAILABLE, naming the file, when it cannot be read.
        """
        try:
            with self._read_lock:
                self._reader.execute("SELECT id FROM events ORDER BY id DESC LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            raise SandboxError(
                ErrorCode.SERVICE_UNAVAILABLE,
                f"the journal at {self.path} cannot be read ({exc}); `sandbox doctor` checks it",
            ) from exc

    def sessions(self, tenant: str, agent: str) -> list[tuple[str, float, int]]:
        """(session, last activity, calls) of every session of `agent` in `tenant` the journal saw."""
        rows = self._read(
            "SELECT session, MAX(ts), COUNT(DISTINCT call_id) FROM events WHERE tenant = ? AND agent = ? "
            "GROUP BY session ORDER BY MAX(ts) DESC LIMIT 10000",
            (tenant, agent),
        )
        return [(str(r[0]), float(r[1]), int(r[2])) for r in rows]

    def unfinished_calls(self) -> list[Event]:
        """The last event of every call whose last stage is not terminal."""
        rows = self._read(
            "SELECT * FROM events WHERE id IN (SELECT MAX(id) FROM events GROUP BY call_id) ORDER BY id", ()
        )
        events = [event_of(row) for row in rows]
        return [e for e in events if e.stage not in TERMINAL]

    # -- approvals ---------------------------------------------------------------------

    def add_approval(self, approval: Approval) -> None:
        """Record a pending approval with its exact arguments (the database is 0600).

        The approver must see what will run, byte for byte: masking could hide executable text,
        so a pending row keeps the raw arguments; the decision replaces them with the masked copy.
        """
        self._write(
            "INSERT INTO approvals VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                approval.id,
                approval.call_id,
                approval.trace_id,
                approval.session,
                approval.agent,
                approval.tool,
                json.dumps(approval.arguments),
                approval.status,
                approval.reason,
                approval.created,
                approval.decided,
            ),
        )

    def decide(self, approval_id: str, status: str, reason: str = "") -> Approval:
        """Approve, deny or expire a pending approval: exactly one decision ever wins.

        The check and the update are one write transaction (`BEGIN IMMEDIATE`), so of two
        deciders (two processes) the second sees the first's decision and gets CONFLICT.

        Raises:
            SandboxError: INVALID_ARGUMENTS for an unknown id; CONFLICT when already decided;
                INTERNAL when the journal cannot be written (nothing was decided).
        """
        row: tuple[Any, ...] | None = None
        won = False
        try:
            with self._lock:
                self._writer.drain_locked()
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    row = self._db.execute("SELECT * FROM approvals WHERE id = ?", (approval_id,)).fetchone()
                    if row is not None and row[7] == "pending":
                        masked = json.dumps(redact(json.loads(row[6]), max_text=None), default=str)
                        cursor = self._db.execute(
                            "UPDATE approvals SET status = ?, reason = ?, decided = ?, arguments = ? "
                            "WHERE id = ? AND status = 'pending'",
                            (status, reason, time.time(), masked, approval_id),
                        )
                        won = cursor.rowcount == 1
                    self._db.execute("COMMIT" if won else "ROLLBACK")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise SandboxError(
                ErrorCode.INTERNAL,
                f"the journal at {self.path} cannot record a decision on approval {approval_id} ({exc}); "
                "nothing was decided",
            ) from exc
        if row is None:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"no approval {approval_id!r}")
        if not won:
            raise SandboxError(
                ErrorCode.CONFLICT,
                f"approval {approval_id} was already decided ({row[7]}); this decision was not recorded",
                status=row[7],
            )
        decided = self.approval(approval_id)
        assert decided is not None
        return decided

    def _read(self, sql: str, args: tuple[Any, ...], *, flush: bool = True) -> list[tuple[Any, ...]]:
        try:
            if flush and not self._writer.idle():
                self.flush()  # a read sees every write queued before it (waits for one in progress)
            with self._read_lock:
                return self._reader.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise SandboxError(ErrorCode.INTERNAL, f"the journal at {self.path} cannot be read ({exc})") from exc

    def approval(self, approval_id: str, *, raw: bool = False) -> Approval | None:
        """One approval, or None; a pending one's arguments masked unless `raw` (for the approver).

        Raises:
            SandboxError: INTERNAL when the journal cannot be read.
        """
        rows = self._read("SELECT * FROM approvals WHERE id = ?", (approval_id,))
        return _approval(rows[0], raw) if rows else None

    def approvals(self, status: str | None = "pending", *, raw: bool = False) -> list[Approval]:
        """Approvals (pending by default), oldest first; arguments as in :meth:`approval`."""
        if status:
            rows = self._read("SELECT * FROM approvals WHERE status = ? ORDER BY created", (status,))
        else:
            rows = self._read("SELECT * FROM approvals ORDER BY created", ())
        return [_approval(r, raw) for r in rows]

    # -- notes from outside a call (the egress proxy's request lines) ---------------------

    def append_note(
        self,
        *,
        ts: float,
        call_id: str,
        session: str,
        tenant: str,
        agent: str,
        tool: str,
        seq: int,
        data: dict[str, Any],
    ) -> None:
        """Record one numbered note under a pseudo call id, once: a note already there (another
        process collected it first) is not written again. Notes never open a call."""
        payload = json.dumps(redact({**data, "seq": seq}), default=str)
        self._write(
            "INSERT INTO events(ts, trace_id, call_id, session, tenant, agent, tool, stage, duration_ms, data) "
            "SELECT ?,?,?,?,?,?,?,?,NULL,? WHERE NOT EXISTS (SELECT 1 FROM events WHERE call_id = ? "
            "AND json_extract(data, '$.seq') = ?)",
            (ts, "", call_id, session, tenant, agent, tool, tool, payload, call_id, seq),
        )

    def last_note(self, call_id: str) -> int:
        """The highest `seq` of the notes under a pseudo call id (0 when none)."""
        rows = self._read("SELECT MAX(json_extract(data, '$.seq')) FROM events WHERE call_id = ?", (call_id,))
        return int(rows[0][0] or 0) if rows else 0

    # -- loop detection: the calls of a session, wherever they were made -------------------

    def loop_add(self, tenant: str, session: str, tool: str, args: str, result: str) -> None:
        """Remember one finished call of a session (digests only) for loop detection.

        Queued like an event: the call has run, so a lost row is logged, never the call's failure;
        :meth:`loop_recent` writes what is queued before it reads.
        """
        try:
            self._writer.submit(None, ((INSERT_LOOP_CALL, [(tenant, session, tool, args, result)]),))
        except sqlite3.Error as exc:
            raise SandboxError(ErrorCode.INTERNAL, f"the journal at {self.path} cannot be written ({exc})") from exc

    def loop_recent(self, tenant: str, session: str, window: int) -> tuple[bool, list[tuple[str, str, str]]]:
        """Whether the session's breaker is tripped, and its last `window` calls, oldest first.

        Raises:
            SandboxError: INTERNAL when the journal cannot be read.
        """
        # no flush: a call's loop row is written before its caller sees the result (Session.call
        # settles it), so the session's next call finds it; waiting here would stall the loop
        state = self._read(
            "SELECT tripped, since_id FROM loop_sessions WHERE tenant = ? AND session = ?",
            (tenant, session),
            flush=False,
        )
        tripped, since = (bool(state[0][0]), int(state[0][1])) if state else (False, 0)
        rows = self._read(
            "SELECT tool, args, result FROM loop_calls WHERE tenant = ? AND session = ? AND id > ? "
            "ORDER BY id DESC LIMIT ?",
            (tenant, session, since, window),
            flush=False,
        )
        return tripped, [(r[0], r[1], r[2]) for r in reversed(rows)]

    def loop_trip(self, tenant: str, session: str) -> None:
        """Trip a session's circuit breaker (it stays tripped until :meth:`loop_reset`)."""
        self._write(
            "INSERT INTO loop_sessions(tenant, session, tripped) VALUES (?,?,1) "
            "ON CONFLICT(tenant, session) DO UPDATE SET tripped = 1",
            (tenant, session),
        )

    def loop_reset(self, tenant: str, session: str) -> None:
        """Forget a session's loop history and reset its breaker (older rows stay, unread)."""
        self._write(
            "INSERT INTO loop_sessions(tenant, session, tripped, since_id) "
            "VALUES (?, ?, 0, (SELECT COALESCE(MAX(id), 0) FROM loop_calls)) "
            "ON CONFLICT(tenant, session) DO UPDATE SET tripped = 0, since_id = excluded.since_id",
            (tenant, session),
        )

    def health(self) -> dict[str, Any]:
        """Integrity, size and counts, for `sandbox status --deep`."""
        with self._lock:
            self._writer.drain_locked()
            integrity = self._db.execute("PRAGMA integrity_check").fetchone()[0]
            events = self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
            pending = self._db.execute("SELECT COUNT(*) FROM approvals WHERE status = 'pending'").fetchone()[0]
            mode = self._db.execute("PRAGMA journal_mode").fetchone()[0]
        size = self.path.stat().st_size if self.path.exists() else 0
        return {
            "path": str(self.path),
            "integrity": integrity,
            "journal_mode": mode,
            "events": events,
            "pending_approvals": pending,
            "bytes": size,
        }


# queued writes of journals still open when the process exits (no close()) are written then
_OPEN: weakref.WeakSet[Journal] = weakref.WeakSet()


@atexit.register
def _flush_open_journals() -> None:
    for journal in list(_OPEN):
        with contextlib.suppress(Exception):  # exiting: a journal that cannot be written was logged
            journal.flush()


def _private_files(path: Path) -> None:
    """The state dir 0700, the database and its -wal/-shm files 0600 (they hold every call's arguments).

    SQLite gives the -wal and -shm files the database file's mode, so creating the database
    0600 before SQLite opens it covers files made later; existing ones are tightened by path.
    An existing file is never opened here: closing any descriptor of a file drops every POSIX
    lock this process holds on it, SQLite's included, and another process then resets the
    shared-memory index under SQLite's feet (SIGBUS, "locking protocol").
    """
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_uid == os.geteuid():  # a directory someone else owns is left alone
        directory.chmod(0o700)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    for name in (str(path), f"{path}-wal", f"{path}-shm"):
        try:
            info = os.lstat(name)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            raise OSError(errno.ELOOP, "the journal or one of its files is a symbolic link", name)
        if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) != 0o600 and info.st_uid == os.geteuid():
            os.chmod(name, 0o600)


def _approval(row: tuple[Any, ...], raw: bool) -> Approval:
    arguments = json.loads(row[6])
    if not raw and row[7] == "pending":  # decided rows were masked by decide()
        arguments = redact(arguments, max_text=None)
    return Approval(row[0], row[1], row[2], row[3], row[4], row[5], arguments, row[7], row[8], row[9], row[10])
