"""The journal's reads: events by filter, a bounded page, the probe, health and the full check.

A mixin of :class:`~sandbox.journal.store.Journal` (it reads through the journal's read connection).
Everything here but :meth:`ReadsMixin.integrity_check` and :meth:`ReadsMixin.session_calls` (one
session's own calls) costs the same at a million events as at ten.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.queries import Event, EventPage, capped_columns, event_of
from sandbox.journal.queries import page as _page
from sandbox.journal.retention import file_bytes
from sandbox.journal.schema import TERMINAL

SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26
REPLICA_NOTE = "whole in its replica''s journal"  # SQL text: '' is one quote
SESSIONS_WINDOW = 10_000  # newest events of an agent a sessions list looks at


def damaged_message(path: Path, exc: BaseException, doing: str = "opened") -> str:
    """What to say about a journal that cannot be opened or read: the file, the cause, the fixes."""
    return (
        f"the journal at {path} cannot be {doing} ({exc}). If it is damaged, stop the service, move "
        f"{path.name} (and its -wal and -shm files) aside and start again: a new, empty journal is made "
        "(open calls and pending approvals it held are lost); `sandbox doctor` checks a journal in full"
    )


def damaged(exc: BaseException) -> bool:
    """Whether SQLite says the file is not a database or is malformed (not a passing lock or I/O error)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)


class ReadsMixin:
    """Reads of the events table and of the file's state."""

    if TYPE_CHECKING:  # provided by Journal
        path: Path
        _reader: sqlite3.Connection
        _read_lock: threading.Lock
        _pinger: sqlite3.Connection
        _ping_lock: threading.Lock

        def _read(self, sql: str, args: tuple[Any, ...], *, flush: bool = True) -> list[tuple[Any, ...]]: ...

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
        tool: str | None = None,
        max_data: int | None = None,
    ) -> EventPage:
        """One page of events, newest first, reading only what it returns (O(limit) at any size;
        with `tool` alone, what it passes on the way: that filter walks no index of its own).

        Args:
            tenant: only this tenant's events (inside the query: a busy neighbour never crowds
                a tenant's page); None for every tenant (the operator's view).
            session: only this session key.
            trace_id: only this trace.
            tool: only this tool's events (`egress`: the egress proxy's log lines).
            max_data: an event whose data is longer comes with a note of its size instead.
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
            tool=tool,
            max_data=max_data,
        )

    def committed_after(self, after_id: int, limit: int, max_data: int = 64 * 1024) -> list[Event]:
        """Committed events after `after_id`, oldest first, for a shared store's copy: data larger
        than `max_data` comes as a note of its size (bounded memory, whatever an event holds).
        What is still queued waits: a shipper's read never drains the writer's queue."""
        rows = self._read(
            f"SELECT {capped_columns(REPLICA_NOTE)} FROM events "  # noqa: S608 - fixed words
            "WHERE id > ? ORDER BY id LIMIT ?",
            (max_data, after_id, limit),
            flush=False,
        )
        return [event_of(row) for row in rows]

    def journal_id(self) -> str:
        """This journal's own random id (made with it): the origin of the events it ships to a
        shared store (state/shipping.py)."""
        rows = self._read("SELECT value FROM journal_meta WHERE key = 'id'", (), flush=False)
        return str(rows[0][0])

    def last_event_id(self) -> int:
        """The id of the newest event (0 for none): where a follower starts."""
        rows = self._read("SELECT COALESCE(MAX(id), 0) FROM events", ())
        return int(rows[0][0])

    def ping(self) -> None:
        """One trivial read of the file (for readiness probes: no integrity check, no count).

        Raises:
            SandboxError: naming the file: INTERNAL (with the fix) when SQLite finds it damaged,
                SERVICE_UNAVAILABLE when it cannot be read now (locked, an I/O error).
        """
        try:
            # its own connection and lock: a probe never waits behind a page (or a prune's read)
            with self._ping_lock:
                self._pinger.execute("SELECT id FROM events ORDER BY id DESC LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            if damaged(exc):
                raise SandboxError(ErrorCode.INTERNAL, damaged_message(self.path, exc, "read")) from exc
            raise SandboxError(
                ErrorCode.SERVICE_UNAVAILABLE,
                f"the journal at {self.path} cannot be read ({exc}); `sandbox doctor` checks it",
            ) from exc

    def sessions(self, tenant: str, agent: str, *, window: int = SESSIONS_WINDOW) -> list[tuple[str, float, int]]:
        """(session, last activity, calls) of the sessions of `agent` in `tenant`, most recent first.

        A bounded read: only the newest `window` events of the agent count (a session idle since
        before them is not listed here, and `calls` counts a session's calls among them), so a
        sessions list costs the same after a month of history as after a day.
        """
        rows = self._read(
            "SELECT session, MAX(ts), COUNT(DISTINCT call_id) FROM (SELECT session, ts, call_id FROM events "
            "WHERE tenant = ? AND +agent = ? ORDER BY id DESC LIMIT ?) GROUP BY session ORDER BY MAX(ts) DESC",
            (tenant, agent, window),
        )
        return [(str(r[0]), float(r[1]), int(r[2])) for r in rows]

    def session_calls(self, tenant: str, agent: str, session: str) -> int:
        """How many calls one session of `tenant` made (its own rows only, by the (tenant, session) index)."""
        rows = self._read(
            "SELECT COUNT(DISTINCT call_id) FROM events WHERE tenant = ? AND session = ? AND +agent = ?",
            (tenant, session, agent),
        )
        return int(rows[0][0])

    def unfinished_calls(self) -> list[Event]:
        """The last event of every call whose last stage is not terminal."""
        rows = self._read(
            "SELECT * FROM events WHERE id IN (SELECT MAX(id) FROM events GROUP BY call_id) ORDER BY id", ()
        )
        events = [event_of(row) for row in rows]
        return [e for e in events if e.stage not in TERMINAL]

    def health(self) -> dict[str, Any]:
        """Size, mode and pending approvals, cheaply (no integrity check, no count of events)."""
        self.ping()
        rows = self._read(
            "SELECT (SELECT COUNT(*) FROM approvals WHERE status = 'pending'), "
            "(SELECT COALESCE(MAX(id), 0) FROM events), (SELECT MIN(ts) FROM events)",
            (),
            flush=False,
        )
        pending, last_id, oldest = rows[0]
        with self._read_lock:
            mode = self._reader.execute("PRAGMA journal_mode").fetchone()[0]
        return {
            "path": str(self.path),
            "journal_mode": mode,
            "last_event_id": int(last_id),
            "oldest_event": oldest,
            "pending_approvals": int(pending),
            "bytes": file_bytes(self.path),
        }

    def auto_vacuum(self) -> str:
        """How freed pages go back to the file system: incremental (in steps), none (only one VACUUM), full."""
        rows = self._read("PRAGMA auto_vacuum", (), flush=False)
        return ("none", "full", "incremental")[int(rows[0][0])]

    def integrity_check(self, max_errors: int = 20) -> list[str]:
        """SQLite's full integrity check: every page read (seconds at a million events; for `doctor`).

        Returns:
            the problems found; empty when the file is sound.

        Raises:
            SandboxError: INTERNAL when the file cannot be read at all.
        """
        rows = self._read(f"PRAGMA integrity_check({int(max_errors)})", (), flush=False)
        found = [str(r[0]) for r in rows]
        return [] if found == ["ok"] else found
