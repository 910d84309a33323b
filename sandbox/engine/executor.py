"""The path of one tool call, as one straight line of small steps (DESIGN.md).

The stages live beside it: engine/call.py (the call's context), engine/stages.py (what happens
before the call runs) and engine/running.py (the run and what follows it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio

from sandbox._log import logger
from sandbox.engine.approvals import ApprovalGate
from sandbox.engine.arguments import MAX_BYTES, MAX_DEPTH
from sandbox.engine.call import Call, Refusal, bound, open_call
from sandbox.engine.handover import Handover
from sandbox.engine.hooks import Hooks
from sandbox.engine.limits import Limiter
from sandbox.engine.loops import LoopDetector
from sandbox.engine.progress import ProgressBus
from sandbox.engine.retry import with_retries
from sandbox.engine.running import MakeContext, Spill, fail, finish, run_once, shape_output
from sandbox.engine.stages import await_approval, check_policy, detect_loops, propose, run_hooks, validate
from sandbox.errors import SandboxError, unavailable_when_full, unrecorded
from sandbox.journal.store import Journal
from sandbox.policy.resolver import ResolvedPolicy
from sandbox.tools.registry import ToolRegistry
from sandbox.tools.spec import ToolResult

CANCELLED_REASON = (
    "cancelled before it finished (its caller went away or the service stopped); what it started was killed"
)


@dataclass
class Engine:
    """What every call goes through: registry, limits, progress, hooks, loops, approvals, journal."""

    registry: ToolRegistry
    limiter: Limiter
    progress: ProgressBus
    max_chars: int
    hooks: Hooks = field(default_factory=Hooks)
    loops: LoopDetector | None = None
    approvals: ApprovalGate | None = None
    journal: Journal | None = None
    max_argument_depth: int = MAX_DEPTH
    max_argument_bytes: int = MAX_BYTES
    # tools an application made possible by giving their provider (web_search)
    providers: frozenset[str] = frozenset()
    # calls this process hands over when it stops (engine/handover.py): not journaled abandoned
    handover: Handover | None = None


async def execute(
    engine: Engine,
    *,
    name: str,
    arguments: Any,
    policy: ResolvedPolicy,
    make_context: MakeContext,
    spill: Spill,
    tenant: str,
    sender: str | None = None,
    trace_id: str | None = None,
    refused: SandboxError | None = None,
    call_id: str | None = None,
    approved: str | None = None,
) -> ToolResult:
    """Run one tool call, each stage journaled: proposed, policy, validation, hooks and loop
    detection, approval, limits, the runtime (with retries), shaping, after hooks.

    With `refused` the call is not run at all: it is journaled (`proposed`, then `blocked` or
    `invalid` with the reason) and comes back as that error, with its own trace and call ids
    (a batch call skipped because a dependency failed, or refused with its batch).

    Every failure comes back as a ToolResult with an error code; nothing raises.
    """
    call = open_call(
        engine, policy, name, tenant=tenant, sender=sender, trace_id=trace_id, call_id=call_id, approved=approved
    )
    with bound(call):
        try:
            return await _stages(call, arguments, refused, make_context, spill)
        except anyio.get_cancelled_exc_class():
            # the caller went away or the service is stopping: the runtime killed what the call
            # started; the journal says so now, so the call is never left open for a live owner
            logger.info("tool_call_cancelled")
            # watchers learn it ended (and the relay lets go of a word it held for it)
            call.event("finished", ok=False, cancelled=True)
            if engine.handover is None or not engine.handover.kept(call.task.call_id):
                call.journal("abandoned", reason=CANCELLED_REASON)  # synchronous: nothing to shield
            raise
        except SandboxError as exc:  # the journal could not be written (or a hook raised): nothing ran unrecorded
            logger.bind(code=exc.code.value, reason=exc.message[:500]).error("tool_call_not_journaled")
            return _ended_in_failure(call, unrecorded(exc))
        except Exception as exc:
            # the one place a foreign exception becomes the call's error (a full disk: retryable)
            logger.exception("tool_call_crashed")
            return _ended_in_failure(call, unavailable_when_full(exc))
        finally:
            if engine.journal is not None:
                engine.journal.forget_pending(call.task.call_id)


def _ended_in_failure(call: Call, error: SandboxError) -> ToolResult:
    """A call that failed outside its stages (its journal, a hook's crash): its result, and its
    watchers told it ended."""
    call.event("finished", ok=False, code=error.code.value)
    return call.failed(error)


async def _stages(
    call: Call, arguments: Any, refused: SandboxError | None, make_context: MakeContext, spill: Spill
) -> ToolResult:
    """The stages in DESIGN.md's order; the first refusal ends the call."""
    if (refusal := propose(call, arguments, refused) or check_policy(call)) is not None:
        return call.refuse(refusal)
    checked = validate(call, arguments)
    if not isinstance(checked, Refusal):
        checked = await run_hooks(call, checked)
    if isinstance(checked, Refusal):
        return call.refuse(checked)
    if (refusal := await detect_loops(call, checked) or await await_approval(call, checked)) is not None:
        return call.refuse(refusal)
    try:
        # a partial, not a lambda: tenacity awaits only what it recognises as a coroutine function
        attempt = partial(run_once, call, checked, make_context)
        ran = await with_retries(attempt, checked.spec.retry, tool=call.tool)
    except SandboxError as exc:
        # mapped after the retries: a full disk is retried by the caller once space is freed
        return await fail(call, checked, unavailable_when_full(exc))
    return await finish(call, checked, await shape_output(call, ran, spill))
