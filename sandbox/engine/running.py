"""The stages of one tool call from its run on, in DESIGN.md's order: limits, runtime, (retry,
in the executor), shape, journal `finished` or `failed`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from sandbox._log import logger
from sandbox.engine.call import Call, Checked, Ran
from sandbox.engine.results import shape
from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.spec import ToolResult

if TYPE_CHECKING:
    from sandbox.config.models import Config
    from sandbox.engine import context as ctxvars
    from sandbox.tools.context import ToolContext

Spill = Callable[["ToolContext", str], Awaitable[str | None]]
MakeContext = Callable[["ctxvars.TaskContext"], Awaitable["ToolContext"]]
TIMEOUT_MARGIN_S = 15.0  # handlers with their own timeout (exec) get to report it themselves


def tool_timeout(config: Config, tool: str, declared: float) -> float:
    """The outer timeout of a call: configured or declared, clamped to limits.timeouts [min, max].

    exec enforces its own timeout (and kills on expiry); its outer limit only backs that up.
    """
    bounds = config.limits.timeouts
    if tool == "exec":
        return config.tools.exec.max_timeout_s + TIMEOUT_MARGIN_S
    wanted = bounds.tools.get(tool, declared)
    return min(max(wanted, bounds.min_s), bounds.max_s)


async def run_once(call: Call, checked: Checked, make_context: MakeContext) -> Ran:
    """Stage 7, limits: wait for a permit (global, tenant, category, tool), then run the call once.

    Raises:
        SandboxError: QUEUE_FULL or QUEUE_TIMEOUT from the limiter, or the run's own error.
    """
    engine = call.engine
    call.event("queued")
    call.journal("queued")
    async with engine.limiter.permit(tenant=call.tenant, category=checked.spec.category, tool=call.tool) as waited:
        waited_s = round(waited, 3)
        call.journal("running", waited_s=waited_s)
        call.event("started", waited_s=waited_s)
        logger.bind(waited_s=waited_s).debug("tool_call_started")
        tool_ctx = await make_context(call.task)
        tool_ctx.note = partial(_note, call)
        if engine.progress.has_subscribers:
            tool_ctx.emit = call.event
        return Ran(tool_ctx, await run_handler(call, checked, tool_ctx))


async def _note(call: Call, stage: str, **data: Any) -> None:
    """A stage a handler records, on disk when this returns (a durable exec's process id)."""
    call.journal(stage, **data)
    if call.engine.journal is not None:
        await call.engine.journal.commit(call.task.call_id)


async def run_handler(call: Call, checked: Checked, tool_ctx: ToolContext) -> Any:
    """Stage 8, runtime: the handler under the tool's timeout, with heartbeats for listeners.

    Raises:
        SandboxError: TIMEOUT past the limit, or whatever the handler raised.
    """
    progress = call.engine.progress
    limit = tool_timeout(tool_ctx.config, call.tool, checked.spec.timeout_s)
    failure: Exception | None = None
    output: Any = None

    async def within_limit() -> None:
        # errors are carried out, past the heartbeat's task group, which would wrap them in a group
        nonlocal failure, output
        try:
            with anyio.fail_after(limit):
                output = await checked.handler(tool_ctx, checked.args)
        except TimeoutError:
            failure = SandboxError(ErrorCode.TIMEOUT, f"{call.tool} did not finish within {limit:g}s")
        except Exception as exc:
            failure = exc

    if progress.has_subscribers:
        async with anyio.create_task_group() as heartbeat:
            heartbeat.start_soon(_heartbeat, progress.heartbeat_s, call.event)
            try:
                await within_limit()
            finally:
                heartbeat.cancel_scope.cancel()
    else:
        await within_limit()  # nobody listens: no task group per call (about 20 µs of each)
    if failure is not None:
        raise failure
    return output


async def _heartbeat(every_s: float, event: Callable[..., None]) -> None:
    while True:
        await anyio.sleep(every_s)
        event("running")


async def fail(call: Call, checked: Checked, error: SandboxError) -> ToolResult:
    """Stage 11, journal `failed`: the error (with any partial output, shaped), after hooks seen."""
    engine = call.engine
    if error.code == ErrorCode.KILLED:
        error = _who_killed(call, error)
    logger.bind(code=error.code.value).info("tool_call_failed")
    call.event("finished", ok=False, code=error.code.value)
    partial = error.details.get("output")
    shaped_partial = shape(partial, engine.max_chars, None).output if partial is not None else None
    result = await engine.hooks.run_after(call.task, call.tool, checked.params, call.failed(error, shaped_partial))
    if engine.loops:
        seen = result.error.model_dump() if result.error else None
        await engine.loops.record(call.tenant, call.session, call.tool, checked.params, seen)
    call.journal("failed", code=error.code.value, message=error.message, output=shaped_partial)
    return result


def _who_killed(call: Call, error: SandboxError) -> SandboxError:
    """When another orchestrator process settled this call (its recovery took this process for
    gone and killed the command), the journal says so: that reason replaces the guess."""
    journal = call.engine.journal
    if journal is None:
        return error
    notes = [e for e in journal.events(call_id=call.task.call_id) if e.stage == "abandoned"]
    if not notes:
        return error
    reason = notes[-1].data.get("reason", "")
    return SandboxError(
        ErrorCode.KILLED,
        f"the command was killed by another orchestrator process that settled this call as abandoned ({reason})",
        **error.details,
    )


def lift_own_spill(output: Any) -> tuple[Any, str | None]:
    """A handler that cut its own output (exec's bounded capture) says where it saved it whole,
    or None where it could not: the key moves from the output to the result."""
    path = output.get("full_output_path", 0) if isinstance(output, dict) else 0
    if path is None or isinstance(path, str):
        output = dict(output)
        del output["full_output_path"]
        return output, path
    return output, None


async def shape_output(call: Call, ran: Ran, spill: Spill) -> ToolResult:
    """Stage 10, shape: cut long text with an explicit marker and save the whole of it in the
    workspace, saying where; a copy that cannot be saved is a warning, never a lost result."""
    max_chars = call.engine.max_chars
    own_cut = isinstance(ran.output, dict) and "full_output_path" in ran.output  # the handler cut it
    output, spill_path = lift_own_spill(ran.output)
    shaped = shape(output, max_chars, f"/.sandbox/outputs/{call.task.call_id}.txt")
    if shaped.truncated and shaped.full_text is not None:
        try:
            spill_path = await spill(ran.context, shaped.full_text)
        except Exception as exc:  # the tool succeeded: a lost copy is a warning, never a lost result
            reason = exc.message if isinstance(exc, SandboxError) else f"{exc.__class__.__name__}: {exc}"
            logger.bind(reason=reason).warning("output_spill_failed")
            call.warnings.append(f"the full output could not be saved ({reason}); only the cut output is available")
        shaped = shape(output, max_chars, spill_path)
    return ToolResult(
        ok=True,
        tool=call.tool,
        call_id=call.task.call_id,
        trace_id=call.task.trace_id,
        output=shaped.output,
        truncated=shaped.truncated or spill_path is not None or own_cut,
        full_output_path=spill_path,
        duration_ms=call.elapsed_ms(),
        warnings=call.warnings,
    )


async def finish(call: Call, checked: Checked, result: ToolResult) -> ToolResult:
    """Stage 11, journal `finished`: after hooks (which may replace the result), loop history,
    the final progress event; a command still running is journaled as a started process."""
    engine = call.engine
    duration = result.duration_ms
    result = await engine.hooks.run_after(call.task, call.tool, checked.params, result)
    if engine.loops:
        await engine.loops.record(call.tenant, call.session, call.tool, checked.params, result.output)
    logger.bind(duration_ms=duration).info("tool_call_finished")
    call.event("finished", ok=True)
    call.journal("finished", output=result.output)
    out = result.output
    if isinstance(out, dict) and out.get("process_id") and out.get("status") == "running":
        call.journal("process_started", process_id=out["process_id"])  # a long call: tracked on
    return result
