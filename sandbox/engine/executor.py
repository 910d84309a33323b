"""The path of one tool call, as one straight line of small steps (DESIGN.md)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from loguru import logger
from pydantic import ValidationError

from sandbox.config.models import Config
from sandbox.engine import context as ctxvars
from sandbox.engine.approvals import ApprovalGate
from sandbox.engine.arguments import MAX_BYTES, MAX_DEPTH, check_arguments, describe
from sandbox.engine.hooks import Hooks
from sandbox.engine.limits import Limiter
from sandbox.engine.loops import LoopDetector
from sandbox.engine.progress import Kind, ProgressBus, ProgressEvent
from sandbox.engine.results import shape
from sandbox.engine.retry import with_retries
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.store import Journal
from sandbox.policy.groups import ALIASES, acting_as
from sandbox.policy.resolver import ResolvedPolicy
from sandbox.tools.context import ToolContext
from sandbox.tools.registry import ToolRegistry
from sandbox.tools.spec import ErrorInfo, ToolResult

Spill = Callable[[ToolContext, str], Awaitable[str | None]]
TIMEOUT_MARGIN_S = 15.0
MAX_TOOL_NAME = 128  # a longer name is no tool; it is cut before it reaches the journal or logs
# stages written together with the next committed one of the same call (see Journal.append)
BUFFERED_STAGES = frozenset(
    {"proposed", "policy_checked", "validated", "approved", "queued"}
)  # handlers with their own timeout (exec) get to report it themselves


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


def tool_timeout(config: Config, tool: str, declared: float) -> float:
    """The outer timeout of a call: configured or declared, clamped to limits.timeouts [min, max].

    exec enforces its own timeout (and kills on expiry); its outer limit only backs that up.
    """
    bounds = config.limits.timeouts
    if tool == "exec":
        return config.tools.exec.max_timeout_s + TIMEOUT_MARGIN_S
    wanted = bounds.tools.get(tool, declared)
    return min(max(wanted, bounds.min_s), bounds.max_s)


def _error_result(
    tool: str, tctx: ctxvars.TaskContext, error: SandboxError, started: float, output: Any = None
) -> ToolResult:
    details = {k: v for k, v in error.details.items() if k != "output"}
    return ToolResult(
        ok=False,
        tool=tool,
        call_id=tctx.call_id,
        trace_id=tctx.trace_id,
        output=output,
        error=ErrorInfo(code=error.code.value, message=error.message, retryable=error.retryable, details=details),
        duration_ms=round((time.perf_counter() - started) * 1000, 2),
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


async def execute(
    engine: Engine,
    *,
    name: str,
    arguments: Any,
    policy: ResolvedPolicy,
    make_context: Callable[[ctxvars.TaskContext], Awaitable[ToolContext]],
    spill: Spill,
    tenant: str,
    sender: str | None = None,
    trace_id: str | None = None,
    refused: SandboxError | None = None,
) -> ToolResult:
    """Run one tool call, each stage journaled: proposed, policy, validation, hooks and loop
    detection, approval, limits, the runtime (with retries), shaping, after hooks.

    With `refused` the call is not run at all: it is journaled (`proposed`, then `blocked` or
    `invalid` with the reason) and comes back as that error, with its own trace and call ids
    (a batch call skipped because a dependency failed, or refused with its batch).
    """
    started = time.perf_counter()
    tool = name.strip().lower() if isinstance(name, str) else type(name).__name__
    tool = ALIASES.get(tool, tool)
    if len(tool) > MAX_TOOL_NAME:
        tool = f"{tool[:MAX_TOOL_NAME]}…(+{len(tool) - MAX_TOOL_NAME} chars)"
        name = tool
    tctx = ctxvars.TaskContext(
        trace_id=trace_id or ctxvars.new_id("t"),
        call_id=ctxvars.new_id("c").replace("-", "_"),
        tenant=tenant,
        agent=policy.agent.id,
        session=policy.session.raw,
        tool=tool,
        sender=sender,
    )
    token = ctxvars.current.set(tctx)
    # every log line of this call, the handler's included, carries the call's context
    scope = logger.contextualize(
        trace_id=tctx.trace_id, call_id=tctx.call_id, tool=tool, session=tctx.session, agent=tctx.agent, tenant=tenant
    )
    scope.__enter__()
    log = logger
    registry = engine.registry

    def event(kind: Kind, **detail: Any) -> None:
        engine.progress.emit(
            ProgressEvent(kind, tctx.call_id, tctx.trace_id, tool, tctx.session, time.perf_counter() - started, detail)
        )

    def journal(stage: str, **data: Any) -> None:
        # committed: before anything runs or waits, and at the end; the stages between ride along
        if engine.journal is not None:
            engine.journal.append(
                trace_id=tctx.trace_id,
                call_id=tctx.call_id,
                session=tctx.session,
                tenant=tenant,
                agent=tctx.agent,
                tool=tool,
                stage=stage,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
                data=data,
                commit=stage not in BUFFERED_STAGES,
            )

    def refuse(stage: str, error: SandboxError) -> ToolResult:
        journal(stage, code=error.code.value, message=error.message)
        return _error_result(tool, tctx, error, started)

    try:
        try:
            # before anything recursive (redaction, json, pydantic) sees them
            check_arguments(arguments, max_depth=engine.max_argument_depth, max_bytes=engine.max_argument_bytes)
        except SandboxError as exc:
            journal("proposed", arguments=describe(arguments), sender=sender)
            log.info("tool_call_invalid")
            return refuse("invalid", exc)
        journal("proposed", arguments=arguments, sender=sender)
        if refused is not None:
            log.bind(code=refused.code.value).info("tool_call_refused")
            return refuse("invalid" if refused.code == ErrorCode.INVALID_ARGUMENTS else "blocked", refused)
        runnable = registry.runnable()
        available = sorted(t for t in policy.allowed if t in runnable)
        if tool not in policy.allowed or tool not in runnable:
            log.info("tool_call_denied")
            reason = "is not available to this session" if tool in registry else "does not exist"
            return refuse(
                "not_found",
                SandboxError(
                    ErrorCode.TOOL_NOT_FOUND,
                    f"tool {name!r} {reason}; available tools: {', '.join(available)}",
                    available=available,
                ),
            )
        journal("policy_checked")
        spec = registry.get(tool)
        handler = registry.handler(tool)
        assert handler is not None
        try:
            args = spec.parameters.model_validate(arguments if arguments is not None else {})
        except ValidationError as exc:
            text, fields = validation_message(exc)
            log.info("tool_call_invalid")
            return refuse(
                "invalid",
                SandboxError(ErrorCode.INVALID_ARGUMENTS, f"invalid arguments for {tool}: {text}", fields=fields),
            )
        params = args.model_dump(mode="json")
        rewritten, blocked, hook_name = await engine.hooks.run_before(tctx, tool, params)
        if blocked is not None:
            if engine.loops:
                engine.loops.record(tenant, tctx.session, tool, params, "blocked")
            return refuse("blocked", SandboxError(ErrorCode.BLOCKED, blocked, hook=hook_name))
        if rewritten != params:
            try:
                args = spec.parameters.model_validate(rewritten)
            except ValidationError as exc:
                text, fields = validation_message(exc)
                return refuse(
                    "invalid",
                    SandboxError(
                        ErrorCode.INVALID_ARGUMENTS,
                        f"hook {hook_name} rewrote the arguments of {tool} into an invalid call: {text}",
                        fields=fields,
                    ),
                )
            params = args.model_dump(mode="json")
        if (governing := acting_as(tool, params)) is not None and governing not in policy.allowed:
            # after any rewrite: `process write` to a running interpreter is a command channel, so it needs exec
            return refuse(
                "blocked",
                SandboxError(
                    ErrorCode.PERMISSION_DENIED,
                    f"{tool} {params.get('action')} acts on a running command and needs {governing}, "
                    "which is not available to this session",
                ),
            )
        journal("validated", arguments=params)
        warnings: list[str] = []
        if engine.loops is not None:
            verdict = engine.loops.check(tenant, tctx.session, tool, params)
            if verdict.level in ("critical", "breaker"):
                engine.loops.record(tenant, tctx.session, tool, params, "blocked")
                return refuse(
                    "blocked",
                    SandboxError(ErrorCode.BLOCKED, verdict.message(), pattern=verdict.pattern, count=verdict.count),
                )
            if verdict.level == "warn":
                warnings.append(verdict.message())
        if engine.approvals is not None and engine.approvals.required(spec, tctx.agent, sender, params):
            journal("awaiting_approval")
            event("queued", awaiting_approval=True)
            try:
                approval = await engine.approvals.wait(tctx, params)
            except SandboxError as exc:
                return refuse("denied" if exc.code == ErrorCode.APPROVAL_DENIED else "failed", exc)
            journal("approved", approval_id=approval.id, reason=approval.reason)

        async def attempt() -> Any:
            event("queued")
            journal("queued")
            async with engine.limiter.permit(tenant=tenant, category=spec.category, tool=tool) as waited:
                journal("running", waited_s=round(waited, 3))
                event("started", waited_s=round(waited, 3))
                log.bind(waited_s=round(waited, 3)).debug("tool_call_started")
                tool_ctx = await make_context(tctx)
                if engine.progress.has_subscribers:
                    tool_ctx.emit = event
                limit = tool_timeout(tool_ctx.config, tool, spec.timeout_s)
                failure: Exception | None = None
                output: Any = None
                # errors are carried out of the task group, which would wrap them in a group
                async with anyio.create_task_group() as heartbeat:
                    if engine.progress.has_subscribers:  # no task per call when nobody listens
                        heartbeat.start_soon(_heartbeat, engine.progress.heartbeat_s, event)
                    try:
                        with anyio.fail_after(limit):
                            output = await handler(tool_ctx, args)
                    except TimeoutError:
                        failure = SandboxError(ErrorCode.TIMEOUT, f"{tool} did not finish within {limit:g}s")
                    except Exception as exc:
                        failure = exc
                    finally:
                        heartbeat.cancel_scope.cancel()
                if failure is not None:
                    raise failure
                return tool_ctx, output

        try:
            tool_ctx, output = await with_retries(attempt, spec.retry, tool=tool)
        except SandboxError as exc:
            log.bind(code=exc.code.value).info("tool_call_failed")
            event("finished", ok=False, code=exc.code.value)
            partial = exc.details.get("output")
            shaped_partial = shape(partial, engine.max_chars, None).output if partial is not None else None
            failed = _error_result(tool, tctx, exc, started, output=shaped_partial)
            failed = await engine.hooks.run_after(tctx, tool, params, failed)
            if engine.loops:
                engine.loops.record(
                    tenant, tctx.session, tool, params, failed.error.model_dump() if failed.error else None
                )
            journal("failed", code=exc.code.value, message=exc.message, output=shaped_partial)
            return failed
        spill_path = None
        if isinstance(output, dict) and isinstance(output.get("full_output_path"), str):
            # the handler cut its own output and saved it whole (exec's bounded capture)
            output = dict(output)
            spill_path = output.pop("full_output_path")
        shaped = shape(output, engine.max_chars, f"/.sandbox/outputs/{tctx.call_id}.txt")
        if shaped.truncated and shaped.full_text is not None:
            try:
                spill_path = await spill(tool_ctx, shaped.full_text)
            except Exception as exc:  # the tool succeeded: a lost copy is a warning, never a lost result
                reason = exc.message if isinstance(exc, SandboxError) else f"{exc.__class__.__name__}: {exc}"
                log.bind(reason=reason).warning("output_spill_failed")
                warnings.append(f"the full output could not be saved ({reason}); only the cut output is available")
            shaped = shape(output, engine.max_chars, spill_path)
        duration = round((time.perf_counter() - started) * 1000, 2)
        result = ToolResult(
            ok=True,
            tool=tool,
            call_id=tctx.call_id,
            trace_id=tctx.trace_id,
            output=shaped.output,
            truncated=shaped.truncated or spill_path is not None,
            full_output_path=spill_path,
            duration_ms=duration,
            warnings=warnings,
        )
        result = await engine.hooks.run_after(tctx, tool, params, result)
        if engine.loops:
            engine.loops.record(tenant, tctx.session, tool, params, result.output)
        log.bind(duration_ms=duration).info("tool_call_finished")
        event("finished", ok=True)
        journal("finished", output=result.output)
        if (
            isinstance(result.output, dict)
            and result.output.get("process_id")
            and result.output.get("status") == "running"
        ):
            journal("process_started", process_id=result.output["process_id"])  # a long call: tracked on
        return result
    except SandboxError as exc:  # the journal could not be written: nothing ran unrecorded
        log.bind(code=exc.code.value).error("tool_call_not_journaled")
        return _error_result(tool, tctx, exc, started)
    except Exception as exc:
        log.exception("tool_call_crashed")
        return _error_result(
            tool, tctx, SandboxError(ErrorCode.INTERNAL, f"internal error ({exc.__class__.__name__})"), started
        )
    finally:
        if engine.journal is not None:
            engine.journal.forget_pending(tctx.call_id)
        scope.__exit__(None, None, None)
        ctxvars.current.reset(token)


async def _heartbeat(every_s: float, event: Callable[..., None]) -> None:
    while True:
        await anyio.sleep(every_s)
        event("running")
