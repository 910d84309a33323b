"""Approvals on PostgreSQL: the decision is a conditional update that also sends NOTIFY, in one
transaction, so exactly one decision wins and the waiter (on any replica) wakes when it commits."""

from __future__ import annotations

import json
import time
from typing import Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.redact import redact
from sandbox.state.protocol import Approval

CHANNEL = "sbx_approvals"
# the columns in the order Approval takes them (each query spells them out)


def _approval(row: tuple[Any, ...], raw: bool) -> Approval:
    arguments = json.loads(row[6])
    if not raw and row[7] == "pending":  # decided rows were masked by decide()
        arguments = redact(arguments, max_text=None)
    return Approval(row[0], row[1], row[2], row[3], row[4], row[5], arguments, row[7], row[8], row[9], row[10])


async def add(conn: Any, approval: Approval) -> None:
    """Insert a pending approval with its exact arguments."""
    await conn.execute(
        "INSERT INTO approvals (id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, "
        "decided) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
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


async def decide(conn: Any, approval_id: str, status: str, reason: str) -> Approval:
    """The one decision (see the module's docstring).

    Raises:
        SandboxError: INVALID_ARGUMENTS for an unknown id; CONFLICT when already decided.
    """
    async with conn.transaction():
        cur = await conn.execute(
            "SELECT id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, decided "
            "FROM approvals WHERE id = %s FOR UPDATE",
            (approval_id,),
        )
        row = await cur.fetchone()
        if row is None:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"no approval {approval_id!r}")
        if row[7] != "pending":
            raise SandboxError(
                ErrorCode.CONFLICT,
                f"approval {approval_id} was already decided ({row[7]}); this decision was not recorded",
                status=row[7],
            )
        masked = json.dumps(redact(json.loads(row[6]), max_text=None), default=str)
        cur = await conn.execute(
            "UPDATE approvals SET status = %s, reason = %s, decided = %s, arguments = %s "
            "WHERE id = %s AND status = 'pending' RETURNING id, call_id, trace_id, session, agent, tool, "
            "arguments, status, reason, created, decided",
            (status, reason, time.time(), masked, approval_id),
        )
        decided = await cur.fetchone()
        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, approval_id))
    return _approval(decided, raw=False)


async def one(conn: Any, approval_id: str, raw: bool) -> Approval | None:
    """One approval, or None."""
    cur = await conn.execute(
        "SELECT id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, decided "
        "FROM approvals WHERE id = %s",
        (approval_id,),
    )
    row = await cur.fetchone()
    return _approval(row, raw) if row is not None else None


async def many(conn: Any, status: str | None, raw: bool = False) -> list[Approval]:
    """Approvals of `status` (all when None), oldest first; pending ones masked unless `raw`."""
    if status:
        cur = await conn.execute(
            "SELECT id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, decided "
            "FROM approvals WHERE status = %s ORDER BY created",
            (status,),
        )
    else:
        cur = await conn.execute(
            "SELECT id, call_id, trace_id, session, agent, tool, arguments, status, reason, created, decided "
            "FROM approvals ORDER BY created"
        )
    return [_approval(row, raw) for row in await cur.fetchall()]


async def prune(conn: Any, older_than: float) -> int:
    """Delete approvals decided before `older_than` (epoch s) whose call is not running (the
    shared store's share of `journal.retention`, as the journal's own): each holds a call's whole
    arguments, and a tenant can ask for one per call. Pending ones always stay."""
    cur = await conn.execute(
        "DELETE FROM approvals WHERE status <> 'pending' AND coalesce(decided, created) < %s "
        "AND call_id NOT IN (SELECT call_id FROM calls WHERE state = 'running')",
        (older_than,),
    )
    return int(cur.rowcount or 0)
