"""Approvals in the journal: a call waiting for a human, and the one decision that wins.

The approval store, held by :class:`~sandbox.journal.store.Journal` (the facade keeps these
methods as its own); it writes through the journal's one connection and lock.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.core import JournalCore
from sandbox.journal.redact import redact


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


class ApprovalStore:
    """The approvals table's reads and writes.

    Args:
        core: the journal whose connection, lock and writer it uses.
    """

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    def add_approval(self, approval: Approval) -> None:
        """Record a pending approval with its exact arguments (the database is 0600).

        The approver must see what will run, byte for byte: masking could hide executable text,
        so a pending row keeps the raw arguments; the decision replaces them with the masked copy.
        """
        self._core._write(
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
            with self._core._lock:
                self._core._writer.drain_locked()
                self._core._db.execute("BEGIN IMMEDIATE")
                try:
                    row = self._core._db.execute("SELECT * FROM approvals WHERE id = ?", (approval_id,)).fetchone()
                    if row is not None and row[7] == "pending":
                        masked = json.dumps(redact(json.loads(row[6]), max_text=None), default=str)
                        cursor = self._core._db.execute(
                            "UPDATE approvals SET status = ?, reason = ?, decided = ?, arguments = ? "
                            "WHERE id = ? AND status = 'pending'",
                            (status, reason, time.time(), masked, approval_id),
                        )
                        won = cursor.rowcount == 1
                    self._core._db.execute("COMMIT" if won else "ROLLBACK")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        self._core._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise SandboxError(
                ErrorCode.INTERNAL,
                f"the journal at {self._core.path} cannot record a decision on approval {approval_id} ({exc}); "
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

    def approval(self, approval_id: str, *, raw: bool = False) -> Approval | None:
        """One approval, or None; a pending one's arguments masked unless `raw` (for the approver).

        Raises:
            SandboxError: INTERNAL when the journal cannot be read.
        """
        rows = self._core._read("SELECT * FROM approvals WHERE id = ?", (approval_id,))
        return _approval(rows[0], raw) if rows else None

    def approvals(self, status: str | None = "pending", *, raw: bool = False) -> list[Approval]:
        """Approvals (pending by default), oldest first; arguments as in :meth:`approval`."""
        if status:
            rows = self._core._read("SELECT * FROM approvals WHERE status = ? ORDER BY created", (status,))
        else:
            rows = self._core._read("SELECT * FROM approvals ORDER BY created", ())
        return [_approval(r, raw) for r in rows]


def _approval(row: tuple[Any, ...], raw: bool) -> Approval:
    arguments = json.loads(row[6])
    if not raw and row[7] == "pending":  # decided rows were masked by decide()
        arguments = redact(arguments, max_text=None)
    return Approval(row[0], row[1], row[2], row[3], row[4], row[5], arguments, row[7], row[8], row[9], row[10])
