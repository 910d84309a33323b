"""What every sandbox does around a tracked command (DESIGN: a timeout kills the work, not just
the wait): when the caller gives up, the stream that ran it dies, or the command outlives its
time or its output bound, everything the call started is stopped, and a stop that cannot be
confirmed removes the sandbox. The engines differ only in how they run, kill and remove."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import anyio

from sandbox._log import logger
from sandbox.runtime.protocol import ExecResult

TERM_GRACE_S = 0.2


async def run_then_stop(
    run: Callable[[], Awaitable[ExecResult]],
    stop: Callable[[], Awaitable[str | None]],
    dies_with: tuple[type[BaseException], ...] = (),
) -> ExecResult:
    """`run()`, then `stop()` the call when it is cancelled, raises one of `dies_with` (its agent
    died: the work must still die), times out or overflows; a stop's note joins the result's."""
    try:
        result = await run()
    except (anyio.get_cancelled_exc_class(), *dies_with):
        with anyio.CancelScope(shield=True):
            await stop()
        raise
    if result.timed_out or result.overflowed:
        with anyio.CancelScope(shield=True):
            note = await stop()
        if note:
            result = dataclasses.replace(result, notes=(*result.notes, note))
    return result


async def stop_confirmed(
    signal: Callable[[str], Awaitable[object]],
    kill_confirmed: Callable[[], Awaitable[bool]],
    remove: Callable[[], Awaitable[None]],
    *,
    sandbox: str,
    call_id: str,
    note: str,
) -> str | None:
    """TERM, a grace period, then a KILL that is confirmed; when it is not, `remove()` the sandbox
    (nothing of the call can go on) and return `note`; None when confirmed."""
    await signal("TERM")
    await anyio.sleep(TERM_GRACE_S)
    if await kill_confirmed():
        return None
    logger.bind(sandbox=sandbox, call_id=call_id).warning("sandbox_kill_unconfirmed")
    await remove()
    return note
