"""Approvals: calls that suspend until a human approves or denies them (or time runs out).

A waiting call holds no concurrency permit (the gate runs before the limiter). Decisions go
through the journal's database, so `sandbox approvals approve ID` from another process works.
"""

from __future__ import annotations

import time

import anyio

from sandbox.config.models import Config
from sandbox.engine.context import TaskContext, new_id
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.store import Approval, Journal
from sandbox.policy.groups import BUILTIN_TOOLS, expand_all
from sandbox.tools.spec import ToolSpec

POLL_S = 0.1


class ApprovalGate:
    """Decides which calls need approval and waits for the decision.

    Args:
        config: the loaded config (`tools.approvals`).
        journal: where approvals are kept and decided.
        universe: every tool name (for patterns and wildcards).
    """

    def __init__(self, config: Config, journal: Journal, universe: tuple[str, ...] = BUILTIN_TOOLS) -> None:
        self.config = config.tools.approvals
        self.journal = journal
        self.universe = universe

    def required(self, spec: ToolSpec, agent: str, sender: str | None) -> bool:
        """Whether this call must wait for a human."""
        if spec.requires_approval:
            return True
        patterns = [*self.config.require, *self.config.by_agent.get(agent, [])]
        if sender:
            patterns += self.config.by_sender.get(sender, [])
        return spec.name in expand_all(patterns, self.universe) if patterns else False

    async def wait(self, ctx: TaskContext, arguments: dict[str, object]) -> Approval:
        """Record a pending approval and wait for its decision.

        Raises:
            SandboxError: APPROVAL_DENIED (with the reason) or APPROVAL_TIMEOUT.
        """
        approval = Approval(
            id=new_id("a"),
            call_id=ctx.call_id,
            trace_id=ctx.trace_id,
            session=ctx.session,
            agent=ctx.agent,
            tool=ctx.tool,
            arguments=dict(arguments),
            status="pending",
            reason="",
            created=time.time(),
            decided=None,
        )
        self.journal.add_approval(approval)
        with anyio.move_on_after(self.config.timeout_s):
            while True:
                current = self.journal.approval(approval.id)
                if current is not None and current.status != "pending":
                    break
                await anyio.sleep(POLL_S)
        current = self.journal.approval(approval.id)
        if current is None or current.status == "pending":
            try:
                self.journal.decide(approval.id, "expired", f"no decision within {self.config.timeout_s:g}s")
            except SandboxError:
                current = self.journal.approval(approval.id)  # decided at the last moment
            else:
                raise SandboxError(
                    ErrorCode.APPROVAL_TIMEOUT,
                    f"{ctx.tool} needed approval {approval.id}; nobody decided within {self.config.timeout_s:g}s",
                    approval_id=approval.id,
                )
        assert current is not None
        if current.status == "denied":
            raise SandboxError(
                ErrorCode.APPROVAL_DENIED,
                f"{ctx.tool} was denied (approval {approval.id}): {current.reason or 'no reason given'}",
                approval_id=approval.id,
            )
        return current
