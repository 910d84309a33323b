"""Call handles: a call submitted to run on its own, whose state and result are asked for later.

`session.submit(tool, args)` records the call (a CallStore: the journal by default) and runs it
in a task of the orchestrator's, not the caller's: a caller that goes away (an HTTP client
that disconnects, a 202 the client never follows) does not stop it. The handle reads its state
(`queued`, `awaiting_approval`, `running`, `finished`, `abandoned`), waits for its ToolResult,
or cancels it: its command is killed as for any cancelled call, and the record says who
cancelled it. `orch.call(call_id)` finds a handle again; the caller checks the tenant.

The states while it runs are this process's (its progress events); the record says `running`
until the call ends, so another process sees `running` or the end, never a stage between.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from sandbox.engine.call import new_call_id
from sandbox.engine.once import Ask, claim, mismatch, run_claimed
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.calls import CallRecord
from sandbox.state.protocol import CallStore
from sandbox.tools.spec import ErrorInfo, ToolResult

if TYPE_CHECKING:
    from sandbox.engine.progress import ProgressBus, ProgressEvent

STOP_WAIT_S = 15.0  # how long closing the orchestrator waits for its submitted calls to stop


@dataclass(frozen=True)
class CallStatus:
    """What a handle says of its call."""

    call_id: str
    state: str
    tenant: str
    session: str
    agent: str
    tool: str
    result: ToolResult | None  # once finished
    reason: str  # why it was abandoned (who cancelled it, or what went away)
    here: bool  # whether it runs in this process (only then can it be cancelled)


class CallHandle:
    """One submitted (or keyed) call, by id."""

    def __init__(self, calls: Calls, call_id: str) -> None:
        self._calls = calls
        self.call_id = call_id

    async def status(self, wait_s: float = 0.0) -> CallStatus | None:
        """Its state now, or once it ended within `wait_s` (None: no such call)."""
        return await self._calls.status(self.call_id, wait_s)

    async def result(self, timeout_s: float | None = None) -> ToolResult:
        """Its ToolResult once it ended; an abandoned call's is its reason as an error (CONFLICT).

        Raises:
            TimeoutError: still running after `timeout_s`.
            SandboxError: INVALID_ARGUMENTS when there is no such call.
        """
        found = await self._calls.status(self.call_id, 10.0**9 if timeout_s is None else timeout_s)
        if found is None:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"no call {self.call_id!r}")
        if found.result is not None:
            return found.result
        if found.state == "abandoned":
            error = ErrorInfo(code=ErrorCode.CONFLICT.value, message=f"the call was abandoned: {found.reason}")
            return ToolResult(ok=False, tool=found.tool, call_id=self.call_id, trace_id="", error=error)
        raise TimeoutError(f"call {self.call_id} is still {found.state}")

    async def cancel(self, by: str = "the caller") -> bool:
        """Stop it (its command is killed); False when it had ended already.

        Raises:
            SandboxError: CONFLICT when it runs in another process (ask that one).
        """
        return await self._calls.cancel(self.call_id, by)


class Calls:
    """The orchestrator's submitted calls: their tasks, live states and records.

    Args:
        store: where call records are (the orchestrator's `call_store`, looked up on each use).
        progress: the orchestrator's progress events (the live states come from them).
    """

    def __init__(self, store: Callable[[], CallStore | None], progress: ProgressBus) -> None:
        self._store = store
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._live: dict[str, str] = {}  # call id -> its state while it runs here
        self._cancelled_by: dict[str, str] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._unsubscribe = progress.subscribe(self._on_progress)

    def store(self) -> CallStore:
        """The call store.

        Raises:
            SandboxError: INVALID_ARGUMENTS without one (an orchestrator without a journal).
        """
        found = self._store()
        if found is None:
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS, "call handles need the journal (this orchestrator has none)"
            )
        return found

    def start(self, call_id: str, work: Callable[[Callable[[], str]], Awaitable[Any]]) -> CallHandle:
        """Run `work(why_cancelled)` for a claimed call in a task of its own; its handle."""
        self._live[call_id] = "queued"

        scope = anyio.CancelScope()
        self._scopes[call_id] = scope

        async def run() -> None:
            try:
                # anyio's own cancellation: the stages' clean-up (killing the command) sees it as
                # a cancellation, where a bare task.cancel() could be taken for a timeout's
                with scope:
                    await work(lambda: self._cancelled_by.get(call_id, "cancelled before it finished"))
            finally:
                self._scopes.pop(call_id, None)
                self._tasks.pop(call_id, None)
                self._live.pop(call_id, None)
                self._cancelled_by.pop(call_id, None)

        self._tasks[call_id] = asyncio.create_task(run())
        return CallHandle(self, call_id)

    def cancelled_by_someone(self, call_id: str) -> bool:
        """Whether a running call was cancelled on purpose (its handle's cancel), not by this
        orchestrator closing."""
        return call_id in self._cancelled_by

    def handle(self, call_id: str) -> CallHandle:
        """A handle of a call by id (whether it exists is for its status to say)."""
        return CallHandle(self, call_id)

    async def status(self, call_id: str, wait_s: float = 0.0) -> CallStatus | None:
        """The call's status, once it ended when that comes within `wait_s`."""
        store = self.store()
        record = await (store.wait_call(call_id, wait_s) if wait_s > 0 else store.call_record(call_id))
        return None if record is None else self._status(record)

    async def cancel(self, call_id: str, by: str) -> bool:
        """Cancel a call running here; see :meth:`CallHandle.cancel`."""
        task = self._tasks.get(call_id)
        if task is None:
            record = await self.store().call_record(call_id)
            if record is None or record.state in ("finished", "abandoned"):
                return False
            raise SandboxError(
                ErrorCode.CONFLICT, f"call {call_id} runs in another process of this service; cancel it there"
            )
        self._cancelled_by[call_id] = f"cancelled by {by}"
        scope = self._scopes.get(call_id)
        if scope is not None:
            scope.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait({task}, timeout=STOP_WAIT_S)
        return True

    async def aclose(self) -> None:
        """Stop every submitted call still running (each is recorded abandoned)."""
        self._unsubscribe()
        tasks = list(self._tasks.values())
        for scope in list(self._scopes.values()):
            scope.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT_S)

    def _status(self, record: CallRecord) -> CallStatus:
        state: str = record.state
        if state not in ("finished", "abandoned"):
            state = self._live.get(record.call_id, state)
        result = ToolResult.model_validate_json(record.result) if record.result else None
        return CallStatus(
            call_id=record.call_id,
            state=state,
            tenant=record.tenant,
            session=record.session,
            agent=record.agent,
            tool=record.tool,
            result=result,
            reason=record.reason,
            here=record.call_id in self._tasks,
        )

    def _on_progress(self, event: ProgressEvent) -> None:
        if event.call_id not in self._live:
            return
        if event.kind == "queued":
            self._live[event.call_id] = "awaiting_approval" if event.detail.get("awaiting_approval") else "queued"
        elif event.kind in ("started", "running", "output"):
            self._live[event.call_id] = "running"


async def submit_call(
    calls: Calls,
    ask: Ask,
    execute: Callable[..., Awaitable[ToolResult]],
    guard: AbstractAsyncContextManager[Any] | None = None,
    kept: Callable[[str], bool] = lambda _: False,
) -> CallHandle:
    """Record `ask` and start it (`execute(call_id=...)` runs it): its handle; for a key already
    held by the same call, that call's handle (nothing new runs). `guard` is held while it runs.

    `guard` (entered already) is exited when the call ends, or at once when nothing runs.

    Raises:
        SandboxError: INVALID_ARGUMENTS for a malformed key, a key used for another call, or no
            call store.
    """
    started = False
    try:
        store = calls.store()
        call_id = new_call_id()
        held = await claim(store, ask, call_id)
        if isinstance(held, CallRecord) and held.call_id != call_id:
            held = mismatch(held, ask, call_id) or held
        if isinstance(held, ToolResult):  # refused: the key's problem
            assert held.error is not None
            raise SandboxError(ErrorCode(held.error.code), held.error.message, **held.error.details)
        if held.call_id != call_id:
            return calls.handle(held.call_id)
        started = True
    finally:
        if not started and guard is not None:
            await guard.__aexit__(None, None, None)

    async def work(why_cancelled: Callable[[], str]) -> None:
        async with guard or contextlib.nullcontext():
            await run_claimed(store, call_id, lambda cid: execute(call_id=cid), why_cancelled, kept)

    return calls.start(call_id, work)
