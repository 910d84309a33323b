"""Notes from outside a call (the egress proxy's request lines) and loop detection's rows.

A mixin of :class:`~sandbox.journal.store.Journal` (it uses the journal's connections and lock).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.redact import redact
from sandbox.journal.schema import INSERT_LOOP_CALL

if TYPE_CHECKING:
    from sandbox.journal.writer import Writer


class NotesMixin:
    """Pseudo calls' notes and the loop-detection tables."""

    if TYPE_CHECKING:  # provided by Journal
        path: Path
        _writer: Writer

        def _read(self, sql: str, args: tuple[Any, ...], *, flush: bool = True) -> list[tuple[Any, ...]]: ...

        def _write(self, sql: str, args: tuple[Any, ...]) -> None: ...

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
            self._writer.submit(None, ((INSERT_LOOP_CALL, [(tenant, session, tool, args, result, time.time())]),))
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
