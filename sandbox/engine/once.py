"""Idempotency keys: a call that carries one runs once, however often it is asked for.

A client that retries after a timeout or a dropped connection cannot know whether its first
attempt ran; with a key, it does not need to. The first call with a key records it (a
CallStore: the journal by default, the shared store across replicas) before anything runs, and
its ToolResult when it ends. A repeat of the key within its lifetime (`journal.idempotency_ttl`,
24 h by default) never runs the tool again: it waits for the first call if it still runs and
returns that call's result. Keys are scoped to the tenant. A repeat that asks for another call
(another tool, other arguments, another session or agent) is refused, naming the key: the key
is the client's promise that it is the same call.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from sandbox._log import logger
from sandbox.engine.call import new_call_id
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.calls import CallRecord
from sandbox.state.protocol import CallStore, TrackedCalls
from sandbox.tools.spec import ErrorInfo, ToolResult

END_TRIES = 4  # ~3.5 s of a store outage is ridden out when a call's end is recorded
MAX_KEY = 200
MAX_BATCH_KEY = 190  # a batch's n-th call runs under `key#n`
# a repeat waits this long at most for the first call to end, then says it still runs (retryable)
REPEAT_WAIT_S = 24 * 3600.0
# the id of the recorded call running in this context (run_claimed): its tools may outlive the process
recorded: ContextVar[str | None] = ContextVar("sandbox_recorded_call", default=None)


def key_problem(key: str, room: int = MAX_KEY) -> str | None:
    """Why `key` cannot be an idempotency key of at most `room` characters (None: it can)."""
    if not key or len(key) > room:
        return f"an idempotency key has 1 to {room} characters (this one has {len(key)})"
    if not all("!" <= ch <= "~" for ch in key):
        return "an idempotency key holds visible ASCII characters only (no spaces or control characters)"
    return None


def fingerprint(tool: str, arguments: Any, agent: str, session: str) -> str:
    """What makes two calls the same call: the tool, the arguments (canonical JSON), who asks."""
    canonical = json.dumps(
        {"tool": tool, "arguments": arguments, "agent": agent, "session": session},
        sort_keys=True,
        ensure_ascii=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _refusal(tool: str, call_id: str, code: ErrorCode, message: str, **details: Any) -> ToolResult:
    return ToolResult(
        ok=False,
        tool=tool,
        call_id=call_id,
        trace_id="",
        error=ErrorInfo(code=code.value, message=message, retryable=False, details=details),
    )


@dataclass(frozen=True)
class Ask:
    """One call as asked for: what its record is made of."""

    tool: str
    arguments: Any
    tenant: str
    agent: str
    session: str
    keep_s: float
    key: str | None = None


async def claim(store: CallStore, ask: Ask, call_id: str) -> CallRecord | ToolResult:
    """Record the call before it runs: the record that holds its key (`call_id`'s own when it
    won, another call's for a repeat), or the refusal of a malformed key. Unkeyed calls always win."""
    if ask.key is not None and (problem := key_problem(ask.key)) is not None:
        return _refusal(ask.tool, call_id, ErrorCode.INVALID_ARGUMENTS, problem, idempotency_key=ask.key[:MAX_KEY])
    mine = CallRecord(
        call_id=call_id,
        tenant=ask.tenant,
        session=ask.session,
        agent=ask.agent,
        tool=ask.tool,
        idempotency_key=ask.key,
        fingerprint=fingerprint(ask.tool, ask.arguments, ask.agent, ask.session),
        state="running",
        result=None,
        reason="",
        created=time.time(),
        ended=None,
    )
    return await store.claim_call(mine, keep_s=ask.keep_s)


async def call_tracked(store: TrackedCalls, ask: Ask, execute: Callable[..., Awaitable[ToolResult]]) -> ToolResult:
    """Run an unkeyed call recorded in the shared store while it runs: if this replica dies
    meanwhile, another settles it and kills what it started (engine/handover.py). The record
    goes when the call ends; its result is not kept. A store that cannot record it refuses the
    call (SERVICE_UNAVAILABLE, retryable): a call nobody could settle never starts."""
    call_id = new_call_id()
    record = CallRecord(
        call_id=call_id,
        tenant=ask.tenant,
        session=ask.session,
        agent=ask.agent,
        tool=ask.tool,
        idempotency_key=None,
        fingerprint="",
        state="running",
        result=None,
        reason="",
        created=time.time(),
        ended=None,
    )
    try:
        await store.track_call(record)
    except SandboxError as exc:
        return ToolResult(
            ok=False,
            tool=ask.tool,
            call_id=call_id,
            trace_id="",
            error=ErrorInfo(code=exc.code.value, message=exc.message, retryable=True),
        )
    try:
        return await execute(call_id=call_id)
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await store.untrack_call(call_id)
            except SandboxError as exc:  # left: this replica's lease holds, so nobody settles it
                logger.bind(call_id=call_id, error=exc.message[:200]).warning("call_record_not_removed")


async def run_claimed(
    store: CallStore,
    call_id: str,
    run: Callable[[str], Awaitable[ToolResult]],
    why_cancelled: Callable[[], str] = lambda: "cancelled before it finished",
    kept: Callable[[str], bool] = lambda _: False,
) -> ToolResult:
    """Run a claimed call and record how it ended (abandoned, with the reason, when cancelled;
    left open when `kept(call_id)`: handed over to the next orchestrator, engine/handover.py).

    While it runs, :data:`recorded` holds its id: the call is durable (tools/handlers/durable.py).
    """
    token = recorded.set(call_id)
    try:
        result = await run(call_id)
    except BaseException:
        if not kept(call_id):
            with anyio.CancelScope(shield=True):
                await _ended(store, call_id, "abandoned", None, why_cancelled())
        raise
    finally:
        recorded.reset(token)
    await _ended(store, call_id, "finished", result.model_dump_json(), "")
    return result


async def _ended(
    store: CallStore, call_id: str, state: Literal["finished", "abandoned"], result: str | None, reason: str
) -> None:
    """Record the end, retried through a short outage of the store (a record left `running` makes
    every repeat wait until its owner is seen gone); what still fails is logged."""
    for attempt in range(END_TRIES):
        try:
            await store.end_call(call_id, state, result, reason)
            return
        except SandboxError as exc:
            if attempt == END_TRIES - 1:
                logger.bind(call_id=call_id, code=exc.code.value, error=exc.message[:200]).error(
                    "call_end_not_recorded"
                )
                return
            await anyio.sleep(0.5 * 2**attempt)


async def call_once(
    store: CallStore | None,
    ask: Ask,
    execute: Callable[..., Awaitable[ToolResult]],
    kept: Callable[[str], bool] = lambda _: False,
) -> ToolResult:
    """Run `execute(call_id=...)` once for `ask.key`, or return the result of the call that holds the key.

    Every outcome is a ToolResult: a malformed key or a key used for another call is
    INVALID_ARGUMENTS; a key whose first call was abandoned (its process died, it was cancelled)
    is CONFLICT, since whether it ran is unknown: a new key runs it again.
    """
    call_id = new_call_id()
    if store is None:
        message = "idempotency keys need the journal (this orchestrator runs without one)"
        return _refusal(ask.tool, call_id, ErrorCode.INVALID_ARGUMENTS, message)
    held = await claim(store, ask, call_id)
    if isinstance(held, ToolResult):
        return held
    if held.call_id != call_id:
        return await repeat(store, held, ask, call_id)
    return await run_claimed(store, call_id, lambda cid: execute(call_id=cid), kept=kept)


def mismatch(held: CallRecord, ask: Ask, call_id: str) -> ToolResult | None:
    """The refusal of a repeat that asks for another call than the key's first (None: the same)."""
    if held.fingerprint == fingerprint(ask.tool, ask.arguments, ask.agent, ask.session):
        return None
    return _refusal(
        ask.tool,
        call_id,
        ErrorCode.INVALID_ARGUMENTS,
        f"idempotency key {ask.key!r} was used for another call ({held.call_id}, tool "
        f"{held.tool}): the tool, its arguments or the session differ; use a new key for a new call",
        idempotency_key=ask.key,
        first_call=held.call_id,
    )


async def repeat(store: CallStore, held: CallRecord, ask: Ask, call_id: str) -> ToolResult:
    """The result a repeat of a key gets: the first call's, once it ended (`call_id`: the repeat's own)."""
    if (refused := mismatch(held, ask, call_id)) is not None:
        return refused
    ended = await store.wait_call(held.call_id, REPEAT_WAIT_S)
    if ended is not None and ended.state == "finished" and ended.result is not None:
        result = ToolResult.model_validate_json(ended.result)
        note = f"idempotency key {ask.key!r}: the result of call {held.call_id}, not a new run"
        return result.model_copy(update={"warnings": [*result.warnings, note]})
    if ended is not None and ended.state == "abandoned":
        message = (
            f"the call with idempotency key {ask.key!r} ({held.call_id}) was abandoned "
            f"({ended.reason or 'its process went away'}): whether it ran is unknown; a new key runs it again"
        )
    else:
        message = f"the call with idempotency key {ask.key!r} ({held.call_id}) is still running"
    return _refusal(ask.tool, call_id, ErrorCode.CONFLICT, message, idempotency_key=ask.key, first_call=held.call_id)
