"""exec: run a command in the session's sandbox (or on the host in mode off), killable on timeout."""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from sandbox.engine import spill
from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.paths import split_path
from sandbox.fs.quota import WorkspaceQuota
from sandbox.runtime.output import describe_cut
from sandbox.runtime.protocol import ExecResult, RunRequest
from sandbox.tools.builtin import ExecArgs
from sandbox.tools.context import ToolContext
from sandbox.tools.handlers import durable, processes
from sandbox.tools.handlers.killed import KILLED_EXITS, killed_error


def resolve_workdir(ctx: ToolContext, workdir: str | None) -> str:
    """A workdir relative to the workspace (or absolute inside it); refused outside it."""
    if not workdir:
        return ctx.workdir
    roots = (ctx.workdir, "/workspace") if ctx.workdir != "/workspace" else (ctx.workdir,)
    _root, parts = split_path(workdir, roots)
    return posixpath.join(ctx.workdir, parts.relative) if parts.parts else ctx.workdir


def effective_timeout(ctx: ToolContext, requested: float | None) -> float:
    """The requested timeout, or the default, never above the configured maximum."""
    cfg = ctx.config.tools.exec
    return min(requested or cfg.default_timeout_s, cfg.max_timeout_s)


T = TypeVar("T")
QUOTA_WATCH_S = 1.0  # how often a running command's workspace is measured


def text(data: bytes) -> str:
    """Command output as text (invalid UTF-8 replaced, never an error)."""
    return data.decode("utf-8", errors="replace")


def stream_text(result: ExecResult, which: int, data: bytes, max_chars: int, where: str | None) -> str:
    """A stream as text; when its middle was not kept, head + a marker saying where it all is + tail.

    Head and tail are sized so the text fits in `max_chars` (results.max_chars) with the marker.
    """
    kept = result.kept.get(which)
    if kept is None:
        return text(data)
    head, tail = text(kept.head)[: int(max_chars * 0.6)], text(kept.tail)[-int(max_chars * 0.3) :]
    cut = kept.total - len(head.encode()) - len(tail.encode())
    return head + describe_cut(cut, kept.total, where) + tail


async def publish_output(ctx: ToolContext, result: ExecResult, notes: list[str]) -> str | None:
    """Where the model finds an output too long to keep in memory: copied into the workspace's
    .sandbox/outputs/ within the spill budget and the quotas (a workspace-relative path), else
    nowhere (a note says why). The host-side capture goes either way (see engine/spill.py)."""
    if not result.full_output_path:
        why = spill.not_kept(ctx) if result.kept else None
        if why is not None:
            notes.append(why)
        return None
    try:
        return await ctx.publish(Path(result.full_output_path))
    except Exception as exc:  # the command ran: a lost copy is a note, never a lost result
        reason = exc.message if isinstance(exc, SandboxError) else f"{exc.__class__.__name__}: {exc}"
        notes.append(f"the full output could not be saved ({reason}); only its head and tail are kept")
        return None


async def run_within_quota(
    quota: WorkspaceQuota | None, run: Callable[[], Awaitable[T]]
) -> tuple[T | None, tuple[WorkspaceQuota, int] | None]:
    """Run a command while measuring its workspace (and its tenant's); stop it (killed, like a
    timeout) once it has grown either past its limit. Returns (result, None) or (None, (the
    quota passed, bytes used))."""
    if quota is None or not quota.enabled:
        return await run(), None
    result: T | None = None
    over: tuple[WorkspaceQuota, int] | None = None
    failure: Exception | None = None
    # measured before the command starts: measured beside it, a command that writes fast (the
    # resident agent starts it in milliseconds) had written it all before the first look, and
    # growth past the limit was never seen
    small = quota.measure_small()  # a small workspace: no thread hop before every command
    start = small if small is not None else await anyio.to_thread.run_sync(quota.measure)
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal over
            while True:
                await anyio.sleep(QUOTA_WATCH_S)
                over = await anyio.to_thread.run_sync(quota.breached, start)
                if over is not None:
                    tg.cancel_scope.cancel()  # the runtime kills a cancelled command
                    return

        async def work() -> None:
            nonlocal result, failure
            try:
                result = await run()
            except Exception as exc:  # re-raised below as itself, not inside an exception group
                failure = exc
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(work)
    if failure is not None:
        raise failure
    return result, over


async def _durable_within_quota(ctx: ToolContext, args: ExecArgs, workdir: str, limit_s: float) -> dict[str, Any]:
    """A durable exec (handlers/durable.py) under the same workspace quota watch as a plain one."""
    body, over = await run_within_quota(ctx.files.quota, lambda: durable.run_durable(ctx, args, workdir, limit_s))
    if body is None:
        assert over is not None  # no body means stopped for the quota
        passed, used = over
        raise passed.exceeded(used, "the command kept writing past it, so it was stopped")
    return body


async def exec_tool(ctx: ToolContext, args: ExecArgs) -> dict[str, Any]:
    """Run `command`; background/yield_ms hand it to the process table."""
    workdir = resolve_workdir(ctx, args.workdir)
    timeout = effective_timeout(ctx, args.timeout_s)
    if args.background or args.yield_ms is not None:
        # yield_ms: the timeout holds after the call returns; background: only when asked for
        limit = timeout if args.yield_ms is not None or args.timeout_s else None
        proc_id = await processes.start(ctx, args.command, workdir=workdir, env=args.env, timeout_s=limit)
        if args.background:
            return {
                "status": "running",
                "process_id": proc_id,
                "hint": "use the process tool to poll, log, write or kill",
            }
        try:
            with anyio.move_on_after((args.yield_ms or 0) / 1000):
                while True:
                    state = await processes.peek(ctx, proc_id)
                    if state["status"] != "running":
                        finished = await processes.poll(ctx, proc_id)
                        finished["process_id"] = proc_id
                        return finished
                    await anyio.sleep(0.05)
        except anyio.get_cancelled_exc_class():
            # the caller went away before the id was handed out: nobody could ever poll or
            # kill this process, so it goes with the call
            with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
                await ctx.shell.kill(proc_id, "KILL")
            raise
        return {
            "status": "running",
            "process_id": proc_id,
            "hint": "still running; use the process tool to poll",
        }

    if ctx.durable and ctx.shell.durable_processes:  # a call with a record: it outlives this process
        return await _durable_within_quota(ctx, args, workdir, timeout)

    capture = await spill.new_capture(ctx)

    async def run() -> ExecResult:
        request = RunRequest(
            args.command,
            call_id=ctx.call_id,
            env={**processes.session_env(ctx), **args.env},
            workdir=workdir,
            timeout_s=timeout,
            on_output=lambda chunk: ctx.emit("output", chunk=chunk.decode("utf-8", errors="replace")),
            capture=capture,
        )
        return await ctx.shell.run(request)

    notes: list[str] = []
    try:
        result, over_quota = await run_within_quota(ctx.files.quota, run)
        where = await publish_output(ctx, result, notes) if result is not None else None
    finally:
        capture.discard()  # the host-side capture never outlives its call
    if result is None:
        if over_quota is None:  # cannot happen: no result means stopped for the quota
            raise SandboxError(ErrorCode.INTERNAL, "the command ended without a result")
        passed, used = over_quota
        raise passed.exceeded(used, "the command kept writing past it, so it was stopped")
    body: dict[str, Any] = {
        "exit_code": result.exit_code,
        "duration_ms": round(result.duration_ms, 1),
    }
    notes = [*result.notes, *notes]
    limit = ctx.config.results.max_chars
    if args.merge_output:
        body["output"] = stream_text(result, 0, result.output, limit, where)
    else:
        body["stdout"] = stream_text(result, 1, result.stdout, limit, where)
        body["stderr"] = stream_text(result, 2, result.stderr, limit, where)
    if args.timeout_s and args.timeout_s > timeout:
        notes.append(f"timeout_s lowered to the configured maximum {timeout:g}s")
    if notes:
        body["note"] = "; ".join(notes)
    if where or result.kept:  # cut here: the engine lifts it (None: not kept) and marks it truncated
        body["full_output_path"] = where
    if result.overflowed:
        cap = ctx.config.tools.exec.max_output_bytes
        raise SandboxError(
            ErrorCode.QUOTA_EXCEEDED,
            f"the command printed more than {cap:,} bytes (tools.exec.max_output_bytes), so it was stopped "
            "and every process it started was killed; redirect large output to a file in the workspace",
            output=body,
        )
    if result.timed_out:
        raise SandboxError(
            ErrorCode.TIMEOUT,
            f"command timed out after {timeout:g}s; it and every process it started were killed"
            + (f" ({'; '.join(result.notes)})" if result.notes else ""),
            output=body,
        )
    if result.exit_code in KILLED_EXITS:
        raise killed_error(ctx, body)
    return body
