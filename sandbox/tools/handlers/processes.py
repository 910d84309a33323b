"""Background processes of one session: started by exec, managed by the process tool.

Output, exit status and stdin live next to the process (in the sandbox); the table of ids is
the session's (tools/process_table.py: its state dir, or the shared store of several replicas),
so a restarted orchestrator, or another replica, finds every process again. Ids are per
session: another session's table does not have them.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import anyio

from sandbox.engine.context import new_id
from sandbox.errors import ErrorCode, SandboxError
from sandbox.runtime import shellwrap
from sandbox.runtime.naming import short_hash
from sandbox.tools.builtin import ProcessArgs
from sandbox.tools.context import ToolContext
from sandbox.tools.process_table import FileProcessTable, ProcessTable

POLL_CHUNK = 200_000
KILL_GRACE_S = 2.0
STDIN_TIMEOUT_S = 5.0


def table_of(ctx: ToolContext) -> ProcessTable:
    """The session's process table (its state dir's file unless the engine gave another)."""
    return ctx.processes if ctx.processes is not None else FileProcessTable(ctx.state_dir)


async def _entry(ctx: ToolContext, proc_id: str | None) -> dict[str, Any]:
    entry = await table_of(ctx).get(proc_id) if proc_id else None
    if entry is None:
        known = ", ".join(sorted(await table_of(ctx).all())) or "none"
        raise SandboxError(
            ErrorCode.INVALID_ARGUMENTS,
            f"no process {proc_id!r} in this session (known: {known})",
            process_id=proc_id,
        )
    return entry


def session_env(ctx: ToolContext) -> dict[str, str]:
    """Environment every command of a sandboxed session gets: a TMPDIR of its own.

    Sessions sharing a container (agent or shared scope) then do not trip over each other's
    temporary file names; they still share /tmp's size (see docs/security.md, what sessions share).
    """
    if not ctx.sandboxed:
        return {}
    # with a uid of its own, the session's TMPDIR is inside its private directory (a predictable
    # /tmp path could be made first by another session, which would then read its temp files)
    own = ctx.shell.tmp_dir
    return {"SBX_TMPDIR": own if own is not None else f"/tmp/session-{short_hash(ctx.session, 16)}"}


FOREIGN_RECORDS = 96  # the scripts' exit status when the session's record directory is not its own


def _foreign(ctx: ToolContext) -> str:
    return (
        f"this session's process records ({ctx.shell.pid_dir}) are held by another user of the "
        "sandbox, so nothing was started or written; report this to the operator (another session "
        "tried to take them over)"
    )


def new_process_id() -> str:
    """A fresh process id (a call id too: its processes are tagged with it)."""
    return new_id("p").replace("-", "_")


async def start(
    ctx: ToolContext,
    command: str,
    *,
    workdir: str,
    env: dict[str, str],
    timeout_s: float | None = None,
    proc_id: str | None = None,
    stdin: bool = True,
) -> str:
    """Start `command` detached and record it; return its process id (`proc_id`, or a new one).

    With `timeout_s` it is killed at that deadline even when nobody polls it any more. Without
    `stdin` its input is at its end at once (nobody writes to it).
    """
    proc_id = proc_id or new_process_id()
    # recorded before it starts (and forgotten if it does not): a process that runs is never
    # one the process tool cannot list or kill (the table may be the shared store, which can fail)
    entry = {"command": command, "started_at": time.time(), "offset": 0, "workdir": workdir, "timeout_s": timeout_s}
    table = table_of(ctx)
    await table.put(proc_id, entry)
    try:
        await _start_recorded(ctx, command, proc_id, workdir, env, timeout_s, stdin)
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
            await table.put(proc_id, None)
        raise
    return proc_id


async def _start_recorded(
    ctx: ToolContext,
    command: str,
    proc_id: str,
    workdir: str,
    env: dict[str, str],
    timeout_s: float | None,
    stdin: bool,
) -> None:
    argv = shellwrap.start_background_argv(command, proc_id, ctx.shell.pid_dir, timeout_s, stdin=stdin)
    # the start helper runs with the tag so that the detached process inherits it; values go
    # through the exec's environment (argv would show them to every `ps` in the sandbox)
    environment = {**session_env(ctx), **env, shellwrap.TAG_VAR: proc_id}
    result = await ctx.shell.run_argv(["sh", "-c", 'cd "$0" && exec "$@"', workdir, *argv], env=environment)
    if result.exit_code == 97 and b"No space left" in result.output:
        raise SandboxError(
            ErrorCode.QUOTA_EXCEEDED,
            f"the sandbox's temporary space ({ctx.shell.pid_dir.rsplit('/', 1)[0] or '/'}) is full, so the "
            "process could not be started; remove files from /tmp (your own TMPDIR first) and try again",
        )
    if result.exit_code == FOREIGN_RECORDS:
        raise SandboxError(ErrorCode.PERMISSION_DENIED, _foreign(ctx))
    if result.exit_code != 0 or b"started" not in result.stdout:
        raise SandboxError(
            ErrorCode.INTERNAL,
            f"could not start the process: {result.output.decode(errors='replace')[-300:]}",
        )


async def poll_raw(ctx: ToolContext, proc_id: str, offset: int, limit: int) -> tuple[str, int, bytes]:
    result = await ctx.shell.run_argv(shellwrap.poll_argv(proc_id, offset, limit, ctx.shell.pid_dir))
    head, _, rest = result.stdout.partition(b"\n")
    size_line, _, data = rest.partition(b"\n")
    status = head.decode().strip() or "gone"
    size = int(size_line) if size_line.strip().isdigit() else 0
    return status, size, data


async def forget(ctx: ToolContext, proc_id: str) -> None:
    """Remove an ended process's records in the sandbox (its log too) and its table entry."""
    await ctx.shell.run_argv(shellwrap.forget_argv(proc_id, ctx.shell.pid_dir))
    await table_of(ctx).put(proc_id, None)


def status_of(raw: str) -> dict[str, Any]:
    if raw.startswith("exited"):
        code = raw.split()[1] if len(raw.split()) > 1 else ""
        return {"status": "exited", "exit_code": int(code) if code.lstrip("-").isdigit() else None}
    if raw == "timed_out":
        return {
            "status": "timed_out",
            "note": "killed at its timeout, with every process it started",
        }
    if raw == "gone":
        return {
            "status": "gone",
            "note": "its sandbox was recreated; the process and its output are gone",
        }
    return {"status": raw}


async def peek(ctx: ToolContext, proc_id: str) -> dict[str, Any]:
    """Status only."""
    await _entry(ctx, proc_id)
    raw, _, _ = await poll_raw(ctx, proc_id, 0, 0)
    return status_of(raw)


async def poll(ctx: ToolContext, proc_id: str) -> dict[str, Any]:
    """New output since the last poll, and the exit status once done."""
    entry = await _entry(ctx, proc_id)
    raw, size, data = await poll_raw(ctx, proc_id, int(entry["offset"]), POLL_CHUNK)
    await table_of(ctx).update(proc_id, {**entry, "offset": int(entry["offset"]) + len(data)})
    return {**status_of(raw), "output": data.decode("utf-8", errors="replace"), "total_bytes": size}


async def write_stdin(ctx: ToolContext, proc_id: str, data: str) -> dict[str, Any]:
    """Write to a running process's stdin: bounded in size and in time, never a hang."""
    size = len(data.encode())
    cap = ctx.config.tools.exec.max_stdin_bytes
    if size > cap:
        raise SandboxError(
            ErrorCode.INVALID_ARGUMENTS,
            f"data is {size:,} bytes; one write takes at most {cap:,} (tools.exec.max_stdin_bytes): "
            "send it in parts, reading the process's output in between",
            size=size,
            limit=cap,
        )
    raw, _, _ = await poll_raw(ctx, proc_id, 0, 0)
    if raw != "running":
        raise SandboxError(ErrorCode.CONFLICT, f"process {proc_id} is not running ({raw})")
    argv = shellwrap.write_stdin_argv(proc_id, data, ctx.shell.pid_dir, STDIN_TIMEOUT_S)
    result = await ctx.shell.run_argv(argv, timeout_s=STDIN_TIMEOUT_S + 10)
    if result.exit_code == 137 or result.timed_out:
        raise SandboxError(
            ErrorCode.TIMEOUT,
            f"process {proc_id} is not reading its standard input: the pipe stayed full for "
            f"{STDIN_TIMEOUT_S:g}s, so the write was stopped (part of the data may have been delivered)",
        )
    if result.exit_code == FOREIGN_RECORDS:
        raise SandboxError(ErrorCode.PERMISSION_DENIED, _foreign(ctx))
    if result.exit_code != 0:
        raise SandboxError(
            ErrorCode.INTERNAL,
            f"could not write to process {proc_id}: {result.output.decode(errors='replace')[-300:]}",
        )
    return {"written": size}


async def process_tool(ctx: ToolContext, args: ProcessArgs) -> dict[str, Any]:
    """list | poll | log | write | kill."""
    if args.action == "list":
        out = []
        for proc_id, entry in (await table_of(ctx).all()).items():
            raw, size, _ = await poll_raw(ctx, proc_id, 0, 0)
            out.append(
                {
                    "id": proc_id,
                    "command": entry["command"],
                    **status_of(raw),
                    "total_bytes": size,
                    "age_s": round(time.time() - float(entry["started_at"]), 1),
                }
            )
        return {"processes": out}
    if args.action == "poll":
        return await poll(ctx, args.id or "")
    await _entry(ctx, args.id)
    proc_id = args.id or ""
    if args.action == "log":
        limit = args.limit or POLL_CHUNK
        raw, size, data = await poll_raw(ctx, proc_id, args.offset, limit)
        return {
            **status_of(raw),
            "offset": args.offset,
            "output": data.decode("utf-8", errors="replace"),
            "total_bytes": size,
        }
    if args.action == "write":
        if args.data is None:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, "action write needs `data`")
        return await write_stdin(ctx, proc_id, args.data)
    # kill: the signal asked for, then KILL after a grace period if anything is left
    await ctx.shell.kill(proc_id, args.signal)
    if args.signal != "KILL":
        with anyio.move_on_after(KILL_GRACE_S):
            while (await peek(ctx, proc_id))["status"] == "running":  # noqa: ASYNC110 - polls another process
                await anyio.sleep(0.1)
        await ctx.shell.kill(proc_id, "KILL")
    return await peek(ctx, proc_id)
