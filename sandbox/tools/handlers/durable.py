"""A durable exec: the command of a call that has a record (an idempotency key, or submitted as a
handle) runs as one of the session's background processes, whose output, exit status and
deadline live in the sandbox, not in this process. The call waits for it as for any command;
when this process goes (kill -9, a deploy that hands its calls over), the command runs on, and
the next orchestrator adopts the call (engine/recovery.py) and records its true outcome.

The output is stdout and stderr in one stream, in order (a background process has one log).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import anyio

from sandbox.errors import ErrorCode, SandboxError
from sandbox.runtime.output import describe_cut
from sandbox.tools.builtin import ExecArgs
from sandbox.tools.context import ToolContext
from sandbox.tools.handlers import processes
from sandbox.tools.handlers.killed import KILLED_EXITS, killed_error

STARTED_STAGE = "durable_started"  # journaled with the process id: what recovery adopts by
FIRST_POLL_S = 0.02
LAST_POLL_S = 0.5
KILL_GRACE_S = 2.0
POLL_TRIES = 5  # polls failing in a row (about 15 s) before the command is stopped and the call fails
MERGED_NOTE = (
    "stdout and stderr come as one stream, in order (a durable call's output is kept in the sandbox while it runs)"
)


async def run_durable(ctx: ToolContext, args: ExecArgs, workdir: str, timeout_s: float) -> dict[str, Any]:
    """Start the command as a background process, journal its id, and wait for its outcome;
    cancelled, it is killed (unless the orchestrator hands its calls over: engine/handover.py)."""
    # its id is on disk before it starts: whenever this process dies, the next one finds it (a
    # cancelled start is killed by it too)
    proc_id = processes.new_process_id()
    await ctx.note(STARTED_STAGE, process_id=proc_id, timeout_s=timeout_s)
    note = {"process_id": proc_id, "timeout_s": timeout_s, "trace_id": ctx.trace_id, "started": time.time()}
    await ctx.record_durable(note)  # a shared store: another replica adopts it if this one goes
    ctx.durable_running(True)
    try:
        await processes.start(
            ctx, args.command, workdir=workdir, env=args.env, timeout_s=timeout_s, proc_id=proc_id, stdin=False
        )
        return await outcome(ctx, proc_id, timeout_s, merged=args.merge_output, started=time.time())
    except anyio.get_cancelled_exc_class():
        if not ctx.handed_over():
            with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
                await stop(ctx, proc_id)
        raise
    finally:
        ctx.durable_running(False)  # a handed-over one stays counted: the handover journals it


async def stop(ctx: ToolContext, proc_id: str) -> None:
    """TERM, a grace period, then KILL everything the process started."""
    await ctx.shell.kill(proc_id, "TERM")
    # a sandbox that does not answer the poll still gets the KILL
    with anyio.move_on_after(KILL_GRACE_S), contextlib.suppress(SandboxError):
        # its records, not its table entry: a start cancelled part-way has removed the entry
        # already, and the KILL below must still come
        while (await processes.poll_raw(ctx, proc_id, 0, 0))[0] == "running":  # noqa: ASYNC110 - a process in the sandbox
            await anyio.sleep(0.05)
    await ctx.shell.kill(proc_id, "KILL")


async def outcome(
    ctx: ToolContext, proc_id: str, timeout_s: float, *, merged: bool = True, started: float
) -> dict[str, Any]:
    """Wait until the process ended (its own deadline kills it at `timeout_s`), streaming its
    output as progress; the exec tool's body, or its error (TIMEOUT, KILLED, SANDBOX_UNAVAILABLE)
    with the body as output."""
    offset, wait, failures = 0, FIRST_POLL_S, 0
    cap = ctx.config.tools.exec.max_output_bytes
    while True:
        try:
            raw, size, data = await processes.poll_raw(ctx, proc_id, offset, processes.POLL_CHUNK)
        except SandboxError:
            failures += 1  # an engine hiccup is ridden out; a sandbox that stays away is not
            if failures >= POLL_TRIES:
                with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
                    await stop(ctx, proc_id)  # nothing runs on unobserved
                raise
            await anyio.sleep(min(0.5 * 2**failures, 5.0))
            continue
        failures = 0
        if data:
            offset += len(data)
            ctx.emit("output", chunk=data.decode("utf-8", errors="replace"))
        if size > cap:  # as a plain exec: printing past tools.exec.max_output_bytes is refused
            ended = raw != "running"
            if not ended:
                with anyio.CancelScope(shield=True):
                    await stop(ctx, proc_id)
            what = "it had ended" if ended else "it was stopped and every process it started was killed"
            text = await _output(ctx, proc_id, size)
            with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
                await processes.forget(ctx, proc_id)
            raise SandboxError(
                ErrorCode.QUOTA_EXCEEDED,
                f"the command printed more than {cap:,} bytes (tools.exec.max_output_bytes): {what}; "
                "redirect large output to a file in the workspace",
                output={"exit_code": None, "output": text},
            )
        if raw != "running":
            break
        await anyio.sleep(wait)
        wait = min(wait * 2, LAST_POLL_S)
    status = processes.status_of(raw)
    body: dict[str, Any] = {
        "exit_code": status.get("exit_code"),
        "duration_ms": round((time.time() - started) * 1000, 1),
    }
    text = await _output(ctx, proc_id, size)
    with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
        await processes.forget(ctx, proc_id)  # its outcome is here now: the sandbox keeps no log of it
    notes = [MERGED_NOTE]
    if merged:
        body["output"] = text
    else:
        body["stdout"], body["stderr"] = text, ""
    body["note"] = "; ".join(notes)
    if status["status"] == "gone":
        raise SandboxError(
            ErrorCode.SANDBOX_UNAVAILABLE,
            "the command's process is gone (its sandbox was removed or recreated, or it never started); "
            "its output went with it",
            output=body,
        )
    if status["status"] == "timed_out":
        raise SandboxError(
            ErrorCode.TIMEOUT,
            f"command timed out after {timeout_s:g}s; it and every process it started were killed",
            output=body,
        )
    if status["status"] == "killed" or body["exit_code"] in KILLED_EXITS:
        body["exit_code"] = body["exit_code"] if body["exit_code"] is not None else 137
        raise killed_error(ctx, body)
    return body


async def _output(ctx: ToolContext, proc_id: str, size: int) -> str:
    """The whole log when it is short; else its head and tail with a marker (the process tool
    reads the rest)."""
    limit = ctx.config.results.max_chars
    if size <= limit:
        _, _, data = await processes.poll_raw(ctx, proc_id, 0, limit)
        return data.decode("utf-8", errors="replace")
    head_bytes, tail_bytes = int(limit * 0.6), int(limit * 0.3)
    _, _, head = await processes.poll_raw(ctx, proc_id, 0, head_bytes)
    _, _, tail = await processes.poll_raw(ctx, proc_id, size - tail_bytes, tail_bytes)
    cut = size - len(head) - len(tail)  # not kept: redirect long output to a file in the workspace
    return head.decode(errors="replace") + describe_cut(cut, size, None) + tail.decode(errors="replace")
