"""Deciding an approval, for the tenants' REST route and the operators' console alike: through
the shared store when there is one (the waiting call may run on another replica, which it wakes),
else through this orchestrator's journal."""

from __future__ import annotations

from typing import Literal

from fastapi import HTTPException

from sandbox.engine.orchestrator import Orchestrator
from sandbox.errors import SandboxError
from sandbox.journal.approvals import Approval

Verdict = Literal["approve", "deny"]
REASON_MAX = 1000  # characters of a decision's reason


async def decide_approval(o: Orchestrator, approval_id: str, verdict: Verdict, reason: str = "") -> Approval:
    """Approve or deny a pending approval; exactly one decision ever wins.

    Raises:
        HTTPException: 409 when it was decided meanwhile (or is unknown to the store).
    """
    reason = reason[:REASON_MAX]
    store = o.approval_store
    try:
        if store is not None:
            return await store.decide(approval_id, "approved" if verdict == "approve" else "denied", reason)
        return (o.approve if verdict == "approve" else o.deny)(approval_id, reason)
    except SandboxError as exc:
        raise HTTPException(409, exc.message) from exc
