"""The stages of one tool call before it runs, in DESIGN.md's order: propose, policy, validate,
hooks (loop detection is one of them), approval.

Each stage either lets the call on (None, or what it established) or stops it with a
:class:`Refusal`, after its own log line; the executor journals the refusal and returns it.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sandbox._log import logger
from sandbox.engine.arguments import check_arguments, describe
from sandbox.engine.call import Call, Checked, Refusal
from sandbox.errors import ErrorCode, SandboxError
from sandbox.policy.groups import acting_as
from sandbox.tools.availability import offered
from sandbox.tools.spec import ToolArgs, ToolSpec


def validation_message(exc: ValidationError) -> tuple[str, list[dict[str, Any]]]:
    """One line per bad field, with its path and reason, and the same as data."""
    fields = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        reason = (
            "is required"
            if err["type"] == "missing"
            else ("is not a known field" if err["type"] == "extra_forbidden" else str(err["msg"]).lower())
        )
        fields.append({"field": path, "reason": reason, "type": err["type"]})
    text = "; ".join(f"{f['field']} {f['reason']}" for f in fields)
    return text, fields


def propose(call: Call, arguments: Any, refused: SandboxError | None = None) -> Refusal | None:
    """Stage 2, journal `proposed`: the call as asked for; a call refused beforehand stops here.

    Arguments over the engine's depth or size limits are journaled only as described (their
    shape and size), before anything recursive (redaction, json, pydantic) sees them.
    """
    engine = call.engine
    sender = call.task.sender
    try:
        check_arguments(arguments, max_depth=engine.max_argument_depth, max_bytes=engine.max_argument_bytes)
    except SandboxError as exc:
        call.journal("proposed", arguments=describe(arguments), sender=sender)
        logger.info("tool_call_invalid")
        return Refusal("invalid", exc)
    call.journal("proposed", arguments=arguments, sender=sender)
    if refused is not None:
        logger.bind(code=refused.code.value).info("tool_call_refused")
        return Refusal("invalid" if refused.code == ErrorCode.INVALID_ARGUMENTS else "blocked", refused)
    return None


def check_policy(call: Call) -> Refusal | None:
    """Stage 3, policy: a tool outside the session's effective set does not exist for the model."""
    registry = call.engine.registry
    available_here = offered(registry, call.policy, call.engine.providers)
    if call.tool in available_here:
        call.journal("policy_checked")
        return None
    logger.info("tool_call_denied")
    available = sorted(available_here)
    reason = "is not available to this session" if call.tool in registry else "does not exist"
    return Refusal(
        "not_found",
        SandboxError(
            ErrorCode.TOOL_NOT_FOUND,
            f"tool {call.name!r} {reason}; available tools: {', '.join(available)}",
            available=available,
        ),
    )


def validate(call: Call, arguments: Any) -> Checked | Refusal:
    """Stage 4, validate: the arguments against the tool's schema, each bad field named."""
    registry = call.engine.registry
    spec = registry.get(call.tool)
    handler = registry.handler(call.tool)
    if handler is None:  # check_policy lets only runnable tools through; an explicit check holds under -O
        return Refusal("failed", SandboxError(ErrorCode.INTERNAL, f"tool {call.tool} has no handler"))
    try:
        args = spec.parameters.model_validate(arguments if arguments is not None else {})
    except ValidationError as exc:
        text, fields = validation_message(exc)
        logger.info("tool_call_invalid")
        error = SandboxError(ErrorCode.INVALID_ARGUMENTS, f"invalid arguments for {call.tool}: {text}", fields=fields)
        return Refusal("invalid", error)
    return Checked(spec, handler, args, args.model_dump(mode="json"))


async def run_hooks(call: Call, checked: Checked) -> Checked | Refusal:
    """Stage 5, hooks: the before_tool_call chain may block the call or rewrite its arguments;
    the final arguments are checked again and journaled as `validated`."""
    engine = call.engine
    rewritten, blocked, hook_name = await engine.hooks.run_before(call.task, call.tool, checked.params)
    if blocked is not None:
        if engine.loops:
            await engine.loops.record(call.tenant, call.session, call.tool, checked.params, "blocked")
        return Refusal("blocked", SandboxError(ErrorCode.BLOCKED, blocked, hook=hook_name))
    if rewritten != checked.params:
        revalidated = _revalidate(call.tool, checked.spec, rewritten, hook_name)
        if isinstance(revalidated, Refusal):
            return revalidated
        checked = Checked(checked.spec, checked.handler, revalidated, revalidated.model_dump(mode="json"))
    if (refusal := check_governing(call, checked.params)) is not None:
        return refusal
    call.journal("validated", arguments=checked.params)
    return checked


def _revalidate(tool: str, spec: ToolSpec, rewritten: dict[str, Any], hook: str) -> ToolArgs | Refusal:
    try:
        return spec.parameters.model_validate(rewritten)
    except ValidationError as exc:
        text, fields = validation_message(exc)
        message = f"hook {hook} rewrote the arguments of {tool} into an invalid call: {text}"
        return Refusal("invalid", SandboxError(ErrorCode.INVALID_ARGUMENTS, message, fields=fields))


def check_governing(call: Call, params: dict[str, Any]) -> Refusal | None:
    """A call that acts on a running command needs the tool that governs it (`process write` to
    a running interpreter is a command channel, so it needs exec); checked after any rewrite."""
    governing = acting_as(call.tool, params)
    if governing is None or governing in call.policy.allowed:
        return None
    message = (
        f"{call.tool} {params.get('action')} acts on a running command and needs {governing}, "
        "which is not available to this session"
    )
    return Refusal("blocked", SandboxError(ErrorCode.PERMISSION_DENIED, message))


async def detect_loops(call: Call, checked: Checked) -> Refusal | None:
    """Stage 5, hooks (loop detection): a repeating session is blocked, an almost repeating one
    warned (the warning rides on the result)."""
    loops = call.engine.loops
    if loops is None:
        return None
    verdict = await loops.check(call.tenant, call.session, call.tool, checked.params)
    if verdict.level in ("critical", "breaker"):
        await loops.record(call.tenant, call.session, call.tool, checked.params, "blocked")
        error = SandboxError(ErrorCode.BLOCKED, verdict.message(), pattern=verdict.pattern, count=verdict.count)
        return Refusal("blocked", error)
    if verdict.level == "warn":
        call.warnings.append(verdict.message())
    return None


async def await_approval(call: Call, checked: Checked) -> Refusal | None:
    """Stage 6, approval: a call that requires it waits for a human's decision (or its timeout)."""
    approvals = call.engine.approvals
    if approvals is None or not approvals.required(checked.spec, call.task.agent, call.task.sender, checked.params):
        return None
    if call.approved is not None:  # decided by the caller already (an agent framework's pause)
        approval = await approvals.approved_by_caller(call.task, checked.params, call.approved)
        call.journal("approved", approval_id=approval.id, reason=approval.reason)
        return None
    call.journal("awaiting_approval")
    call.event("queued", awaiting_approval=True)
    try:
        approval = await approvals.wait(call.task, checked.params)
    except SandboxError as exc:
        return Refusal("denied" if exc.code == ErrorCode.APPROVAL_DENIED else "failed", exc)
    call.journal("approved", approval_id=approval.id, reason=approval.reason)
    return None
