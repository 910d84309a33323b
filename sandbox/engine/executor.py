"""The path of one tool call, as one straight line of small steps (DESIGN.md)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from loguru import logger
from pydantic import ValidationError

from sandbox.engine import context as ctxvars
from sandbox.engine.results import shape
from sandbox.errors import ErrorCode, SandboxError
from sandbox.policy.resolver import ResolvedPolicy
from sandbox.tools.context import ToolContext
from sandbox.tools.handlers import Handler
from sandbox.tools.spec import ErrorInfo, ToolResult, ToolSpec

Spill = Callable[[ToolContext, str], Awaitable[str | None]]
TIMEOUT_MARGIN_S = 15.0  # handlers with their own timeout (exec) get to report it themselves


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


async def execute(
    *,
    name: str,
    arguments: Any,
    policy: ResolvedPolicy,
    specs: dict[str, ToolSpec],
    handlers: dict[str, Handler],
    make_context: Callable[[ctxvars.TaskContext], Awaitable[ToolContext]],
    spill: Spill,
    max_chars: int,
    tenant: str,
    sender: str | None = None,
    trace_id: str | None = None,
) -> ToolResult:
    """Run one tool call through policy, validation, the runtime and result shaping."""
    started = time.perf_counter()
    tool = name.strip().lower() if isinstance(name, str) else str(name)
    tool = "exec" if tool == "bash" else tool
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
    log = logger.bind(trace_id=tctx.trace_id, call_id=tctx.call_id, tool=tool, session=tctx.session)
    try:
        available = sorted(t for t in policy.allowed if t in handlers)
        if tool not in policy.allowed or tool not in handlers or tool not in specs:
            log.info("tool_call_denied")
            reason = "is not available to this session" if tool in specs else "does not exist"
            return _error_result(
                tool,
                tctx,
                SandboxError(
                    ErrorCode.TOOL_NOT_FOUND,
                    f"tool {name!r} {reason}; available tools: {', '.join(available)}",
                    available=available,
                ),
                started,
            )
        spec = specs[tool]
        try:
            args = spec.parameters.model_validate(arguments if arguments is not None else {})
        except ValidationError as exc:
            text, fields = validation_message(exc)
            return _error_result(
                tool,
                tctx,
                SandboxError(
                    ErrorCode.INVALID_ARGUMENTS,
                    f"invalid arguments for {tool}: {text}",
                    fields=fields,
                ),
                started,
            )
        log.debug("tool_call_started")
        try:
            tool_ctx = await make_context(tctx)
            limit = spec.timeout_s
            if tool == "exec":
                limit = tool_ctx.config.tools.exec.max_timeout_s + TIMEOUT_MARGIN_S
            with anyio.fail_after(limit):
                output = await handlers[tool](tool_ctx, args)
        except TimeoutError:
            return _error_result(
                tool,
                tctx,
                SandboxError(ErrorCode.TIMEOUT, f"{tool} did not finish within {limit:g}s"),
                started,
            )
        except SandboxError as exc:
            log.bind(code=exc.code.value).info("tool_call_failed")
            partial = exc.details.get("output")
            if partial is not None:
                shaped_partial = shape(partial, max_chars, None).output
                return _error_result(tool, tctx, exc, started, output=shaped_partial)
            return _error_result(tool, tctx, exc, started)
        spill_path = None
        shaped = shape(output, max_chars, f"/.sandbox/outputs/{tctx.call_id}.txt")
        if shaped.truncated and shaped.full_text is not None:
            spill_path = await spill(tool_ctx, shaped.full_text)
            shaped = shape(output, max_chars, spill_path)
        log.bind(duration_ms=round((time.perf_counter() - started) * 1000, 2)).info("tool_call_finished")
        return ToolResult(
            ok=True,
            tool=tool,
            call_id=tctx.call_id,
            trace_id=tctx.trace_id,
            output=shaped.output,
            truncated=shaped.truncated,
            full_output_path=spill_path,
            duration_ms=round((time.perf_counter() - started) * 1000, 2),
        )
    except Exception as exc:
        log.exception("tool_call_crashed")
        return _error_result(
            tool,
            tctx,
            SandboxError(ErrorCode.INTERNAL, f"internal error ({exc.__class__.__name__})"),
            started,
        )
    finally:
        ctxvars.current.reset(token)
