"""Approvals on SQLite: the decision is a conditional update in one write transaction, so of two
deciders (two processes) the second sees the first's decision and gets CONFLICT."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.redact import redact
from sandbox.state.protocol import Approval

# the columns in the order Approval takes them (each query spells them out)


def _approval(row: tuple[Any, ...], raw: bool) -> Approval:
    arguments = json.loads(row[6])
    if not raw and row[7] == "pending":  # decided rows were masked by decide()
        arguments = redact(arguments, max_text=None)
    return Approval(row[0], row[1], row[2], row[3], row[4], row[5], arguments, row[7], row[8], row[9], row[10])


def add(db: sqlite3.Connection, approval: Approval) -> None:
    """Insert a pending approval with its exact arguments."""
    db.execute(
        "INSERT INTO approvals (id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, "
        "decided) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            approval.id,
            approval.call_id,
            approval.trace_id,
            approval.session,
            approval.agent,
            approval.tool,
            json.dumps(approval.arguments, default=str),
            approval.status,
            approval.reason,
            approval.created,
            approval.decided,
        ),
    )


def decide(db: sqlite3.Connection, approval_id: str, status: str, reason: str) -> Approval:
    """The one decision.

    Raises:
        SandboxError: INVALID_ARGUMENTS for an unknown id; CONFLICT when already decided.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        row = db.execute(
            "SELECT id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, decided "
            "FROM approvals WHERE id = ?",
            (approval_id,),
        ).fetchone()
        won = False
        if row is not None and row[7] == "pending":
            masked = json.dumps(redact(json.loads(row[6]), max_text=None), default=str)
            cursor = db.execute(
                "UPDATE approvals SET status = ?, reason = ?, decided = ?, arguments = ? "
                "WHERE id = ? AND status = 'pending'",
                (status, reason, time.time(), masked, approval_id),
            )
            won = cursor.rowcount == 1
        db.execute("COMMIT" if won else "ROLLBACK")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    if row is None:
        raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"no approval {approval_id!r}")
    if not won:
        raise SandboxError(
            ErrorCode.CONFLICT,
            f"approval {approval_id} was already decided ({row[7]}); this decision was not recorded",
            status=row[7],
        )
    decided = one(db, approval_id, raw=False)
    assert decided is not None
    return decided


def one(db: sqlite3.Connection, approval_id: str, raw: bool) -> Approval | None:
    """One approval, or None."""
    row = db.execute(
        "SELECT id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, decided "
        "FROM approvals WHERE id = ?",
        (approval_id,),
    ).fetchone()
    return _approval(row, raw) if row is not None else None


def many(db: sqlite3.Connection, status: str | None, raw: bool = False) -> list[Approval]:
    """Approvals of `status` (all when None), oldest first; pending ones masked unless `raw`."""
    if status:
        rows = db.execute(
            "SELECT id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, decided "
            "FROM approvals WHERE status = ? ORDER BY created",
            (status,),
        ).fetchall()
    else:
        rows = db.execute(
            "SELECT id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, decided "
            "FROM approvals ORDER BY created"
        ).fetchall()
    return [_approval(row, raw) for row in rows]
