"""Approvals: calls that suspend until a human approves or denies them (or time runs out).

A waiting call holds no concurrency permit (the gate runs before the limiter). Decisions go
through the journal's database, so `sandbox approvals approve ID` from another process works.

What a rule covers: patterns expand like policy patterns (so `write` names every tool that
writes files: write, edit, apply_patch), and a rule that names `exec` also covers the `process`
actions that act on a running command (`write` sends it input, `kill` sends it a signal): an
approved interpreter must not become an unapproved command channel. Reading a process (`list`,
`poll`, `log`) needs no approval.

With a shared store (`state.url: postgresql://...`, set by the service with `share`), approvals
live there instead: a decision made through any replica wakes the waiting call at once (LISTEN/
NOTIFY), and the journal's approvals table is not used.

Fail closed: a call runs only when its approval is read back as `approved` with the arguments
that will run; any failure to read or record the decision refuses the call.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import anyio

from sandbox.config.models import Config
from sandbox.engine.context import TaskContext, new_id
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.redact import redact
from sandbox.journal.store import Approval, Journal
from sandbox.policy.groups import BUILTIN_TOOLS, acting_as, expand_all
from sandbox.state.protocol import ApprovalStore
from sandbox.tools.spec import ToolSpec

POLL_S = 0.1


def covered(tool: str, params: dict[str, Any], named: frozenset[str]) -> bool:
    """Whether a call of `tool` with `params` falls under rules naming the tools in `named`."""
    return tool in named or acting_as(tool, params) in named


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
        self.store: ApprovalStore | None = None  # the shared store, while the service holds one

    async def _read(self, approval_id: str) -> Approval | None:
        if self.store is not None:
            return await self.store.approval(approval_id)
        return self.journal.approval(approval_id)

    async def _decide(self, approval_id: str, status: str, reason: str) -> Approval:
        if self.store is not None:
            return await self.store.decide(approval_id, status, reason)
        return self.journal.decide(approval_id, status, reason)

    def required(self, spec: ToolSpec, agent: str, sender: str | None, params: dict[str, Any] | None = None) -> bool:
        """Whether this call must wait for a human."""
        if spec.requires_approval:
            return True
        patterns = [*self.config.require, *self.config.by_agent.get(agent, [])]
        if sender:
            patterns += self.config.by_sender.get(sender, [])
        return covered(spec.name, params or {}, expand_all(patterns, self.universe)) if patterns else False

    async def wait(self, ctx: TaskContext, arguments: dict[str, object]) -> Approval:
        """Record a pending approval (with the exact arguments) and wait for its decision.

        Raises:
            SandboxError: APPROVAL_DENIED (with the reason), APPROVAL_TIMEOUT (also when the
                expiry cannot be recorded), INTERNAL when the approval cannot be read back.
        """
        approval = _pending(ctx, arguments)
        if self.store is not None:
            await self.store.add_approval(approval)
        else:
            self.journal.add_approval(approval)
        try:
            with anyio.move_on_after(self.config.timeout_s):
                await self._until_decided(approval.id)
        except anyio.get_cancelled_exc_class():
            # the caller went away (or the service stopped): nobody waits for this decision, so
            # no approver may "approve" a call that will never run
            with contextlib.suppress(SandboxError), anyio.CancelScope(shield=True):
                await self._decide(approval.id, "cancelled", "the call was cancelled while it waited")
            raise
        return await self._settle(ctx, approval.id, arguments)

    async def approved_by_caller(self, ctx: TaskContext, arguments: dict[str, object], reason: str) -> Approval:
        """Record an approval the caller made before the call (an agent framework's own pause,
        sandbox/adapters/): pending with the exact arguments, then approved at once, with a
        reason that says so. Only a caller who may decide this tenant's approvals anyway can
        pass it (the library's caller; the service's tenant, like POST /v1/approvals/{id}/approve).
        """
        approval = _pending(ctx, arguments)
        said = f"approved by the caller before the call: {reason[:300]}"
        if self.store is not None:
            await self.store.add_approval(approval)
            return await self.store.decide(approval.id, "approved", said)
        self.journal.add_approval(approval)
        return self.journal.decide(approval.id, "approved", said)

    async def _until_decided(self, approval_id: str) -> None:
        """Return once the approval is decided (the caller bounds the wait)."""
        if self.store is not None:
            try:  # woken by the decision itself, through whichever replica it was made
                await self.store.wait_decided(approval_id, self.config.timeout_s)
            except SandboxError:
                await anyio.sleep_forever()  # the store is down: the final read decides (fail closed)
            return
        while True:
            try:
                current = self.journal.approval(approval_id)
            except SandboxError:
                current = None  # a read that fails now may work later; the final read decides
            if current is not None and current.status != "pending":
                return
            await anyio.sleep(POLL_S)

    async def _settle(self, ctx: TaskContext, approval_id: str, arguments: dict[str, object]) -> Approval:
        current = await self._read(approval_id)
        if current is None or current.status == "pending":
            try:
                await self._decide(approval_id, "expired", f"no decision within {self.config.timeout_s:g}s")
            except SandboxError as exc:
                if exc.code != ErrorCode.CONFLICT:
                    # not recorded as expired: an approver may still see it pending, but it never runs
                    raise SandboxError(
                        ErrorCode.APPROVAL_TIMEOUT,
                        f"{ctx.tool} needed approval {approval_id}; nobody decided within "
                        f"{self.config.timeout_s:g}s and the expiry could not be recorded ({exc.message})",
                        approval_id=approval_id,
                    ) from exc
                current = await self._read(approval_id)  # decided at the last moment: read it back
            else:
                raise SandboxError(
                    ErrorCode.APPROVAL_TIMEOUT,
                    f"{ctx.tool} needed approval {approval_id}; nobody decided within {self.config.timeout_s:g}s",
                    approval_id=approval_id,
                )
        status = current.status if current is not None else "missing"
        if current is None or status != "approved":
            if status == "denied":
                reason = current.reason if current is not None else ""
                raise SandboxError(
                    ErrorCode.APPROVAL_DENIED,
                    f"{ctx.tool} was denied (approval {approval_id}): {reason or 'no reason given'}",
                    approval_id=approval_id,
                )
            code = ErrorCode.APPROVAL_TIMEOUT if status in ("expired", "pending") else ErrorCode.INTERNAL
            raise SandboxError(code, f"{ctx.tool} was not approved (approval {approval_id} is {status})")
        # the decided row keeps the masked copy: it must be the masked copy of what will run
        if current.arguments != json.loads(json.dumps(redact(arguments, max_text=None), default=str)):
            raise SandboxError(
                ErrorCode.INTERNAL,
                f"approval {approval_id} was given for other arguments than the call's; the call was not run",
                approval_id=approval_id,
            )
        return current


def _pending(ctx: TaskContext, arguments: dict[str, object]) -> Approval:
    """A new pending approval of the call `ctx`, with its exact arguments."""
    return Approval(
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
