"""The loop-history store: the calls of a session, wherever they were made, for loop detection.

Held by :class:`~sandbox.journal.store.Journal` (the facade keeps these methods as its own, the
`LoopStore` engine/loops.py asks for); it writes through the journal's one connection and lock.
"""

from __future__ import annotations

import sqlite3
import time

from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.core import JournalCore
from sandbox.journal.schema import INSERT_LOOP_CALL


class LoopHistory:
    """The loop_calls and loop_sessions tables: digests of a session's calls and its breaker.

    Args:
        core: the journal whose connection, lock and writer it uses.
    """

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    def loop_add(self, tenant: str, session: str, tool: str, args: str, result: str) -> None:
        """Remember one finished call of a session (digests only) for loop detection.

        Queued like an event: the call has run, so a lost row is logged, never the call's failure;
        :meth:`loop_recent` writes what is queued before it reads.
        """
        try:
            self._core._writer.submit(None, ((INSERT_LOOP_CALL, [(tenant, session, tool, args, result, time.time())]),))
        except sqlite3.Error as exc:
            raise SandboxError(
                ErrorCode.INTERNAL, f"the journal at {self._core.path} cannot be written ({exc})"
            ) from exc

    def loop_recent(self, tenant: str, session: str, window: int) -> tuple[bool, list[tuple[str, str, str]]]:
        """Whether the session's breaker is tripped, and its last `window` calls, oldest first.

        Raises:
            SandboxError: INTERNAL when the journal cannot be read.
        """
        # no flush: a call's loop row is written before its caller sees the result (Session.call
        # settles it), so the session's next call finds it; waiting here would stall the loop
        state = self._core._read(
            "SELECT tripped, since_id FROM loop_sessions WHERE tenant = ? AND session = ?",
            (tenant, session),
            flush=False,
        )
        tripped, since = (bool(state[0][0]), int(state[0][1])) if state else (False, 0)
        rows = self._core._read(
            "SELECT tool, args, result FROM loop_calls WHERE tenant = ? AND session = ? AND id > ? "
            "ORDER BY id DESC LIMIT ?",
            (tenant, session, since, window),
            flush=False,
        )
        return tripped, [(r[0], r[1], r[2]) for r in reversed(rows)]

    def loop_trip(self, tenant: str, session: str) -> None:
        """Trip a session's circuit breaker (it stays tripped until :meth:`loop_reset`, or until
        journal retention forgets it, `max_age` after it tripped)."""
        self._core._write(
            "INSERT INTO loop_sessions(tenant, session, tripped, ts) VALUES (?,?,1,?) "
            "ON CONFLICT(tenant, session) DO UPDATE SET tripped = 1, ts = excluded.ts",
            (tenant, session, time.time()),
        )

    def loop_reset(self, tenant: str, session: str) -> None:
        """Forget a session's loop history and reset its breaker (older rows stay, unread)."""
        self._core._write(
            "INSERT INTO loop_sessions(tenant, session, tripped, since_id, ts) "
            "VALUES (?, ?, 0, (SELECT COALESCE(MAX(id), 0) FROM loop_calls), ?) "
            "ON CONFLICT(tenant, session) DO UPDATE SET tripped = 0, since_id = excluded.since_id, ts = excluded.ts",
            (tenant, session, time.time()),
        )
