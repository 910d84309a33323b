"""exec: run a command in the session's sandbox (or on the host in mode off), killable on timeout."""

from __future__ import annotations

import posixpath
from typing import Any

import anyio

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.paths import split_path
from sandbox.tools.builtin import ExecArgs
from sandbox.tools.context import ToolContext
from sandbox.tools.handlers import processes


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


def text(data: bytes) -> str:
    """Command output as text (invalid UTF-8 replaced, never an error)."""
    return data.decode("utf-8", errors="replace")


async def exec_tool(ctx: ToolContext, args: ExecArgs) -> dict[str, Any]:
    """Run `command`; background/yield_ms hand it to the process table."""
    workdir = resolve_workdir(ctx, args.workdir)
    timeout = effective_timeout(ctx, args.timeout_s)
    if args.background or args.yield_ms is not None:
        proc_id = await processes.start(ctx, args.command, workdir=workdir, env=args.env)
        if args.background:
            return {
                "status": "running",
                "process_id": proc_id,
                "hint": "use the process tool to poll, log, write or kill",
            }
        with anyio.move_on_after((args.yield_ms or 0) / 1000):
            while True:
                state = await processes.peek(ctx, proc_id)
                if state["status"] != "running":
                    finished = await processes.poll(ctx, proc_id)
                    finished["process_id"] = proc_id
                    return finished
                await anyio.sleep(0.05)
        return {
            "status": "running",
            "process_id": proc_id,
            "hint": "still running; use the process tool to poll",
        }
    result = await ctx.shell.run(
        args.command,
        call_id=ctx.call_id,
        env=args.env,
        workdir=workdir,
        timeout_s=timeout,
        on_output=lambda chunk: ctx.emit("output", chunk=chunk.decode("utf-8", errors="replace")),
    )
    body: dict[str, Any] = {
        "exit_code": result.exit_code,
        "duration_ms": round(result.duration_ms, 1),
    }
    if args.merge_output:
        body["output"] = text(result.output)
    else:
        body["stdout"], body["stderr"] = text(result.stdout), text(result.stderr)
    if args.timeout_s and args.timeout_s > timeout:
        body["note"] = f"timeout_s lowered to the configured maximum {timeout:g}s"
    if result.timed_out:
        raise SandboxError(
            ErrorCode.TIMEOUT,
            f"command timed out after {timeout:g}s; it and every process it started were killed",
            output=body,
        )
    return body
