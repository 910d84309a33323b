"""Notes from outside a call (the egress proxy's request lines): events under pseudo call ids.

Part of the event store: a mixin of :class:`~sandbox.journal.store.Journal` (it uses the
journal's connections and lock).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.journal.redact import redact

if TYPE_CHECKING:
    from sandbox.journal.writer import Writer


class NotesMixin:
    """Pseudo calls' notes."""

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
