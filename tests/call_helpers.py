"""A call killed from outside while it runs: start it, wait until the journal shows it running,
do what an outsider does, and return the call's result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from sandbox.journal.store import Journal


async def killed_mid_call(
    sess: Any,
    journal: Journal,
    command: str,
    kill: Callable[[str, str], Awaitable[None]],
    *,
    settle_s: float = 0.3,
) -> Any:
    """Run exec `command` in `sess`; once `journal` (any orchestrator's on the same state dir)
    shows it running and `settle_s` more have passed, await `kill(call_id, owner)`."""
    result: Any = None

    async def victim() -> None:
        nonlocal result
        result = await sess.call("exec", {"command": command})

    async with anyio.create_task_group() as tg:
        tg.start_soon(victim)
        with anyio.fail_after(30):
            while not any(stage == "running" for _, _, stage, _ in journal.open_calls()):
                await anyio.sleep(0.02)
            await anyio.sleep(settle_s)  # the command is past its start
        ((call_id, owner, _, _),) = journal.open_calls()
        await kill(call_id, owner)
    return result
