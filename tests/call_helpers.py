"""Calls driven the way faults and attacks need: a call killed from outside while it runs (start
it, wait until the journal shows it running, do what an outsider does, return its result), and
file writes racing a folder swapped for a link."""

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


async def writes_during_a_swap_race(
    sess: Any, target: str, *, writes: int = 60, seconds: float = 4.0
) -> tuple[int, dict[str, int]]:
    """A background loop in the sandbox swaps folder `d` for a link to `target` and back while
    the file tools write into `d/`: at least `writes` writes (a slow machine makes fewer in a
    given time) and for at least `seconds` (a slow sandbox, gVisor's, swaps fewer times in a given
    number of writes). Returns how many swaps happened meanwhile and the writes' outcomes."""
    import time

    swap = (
        "rm -f swaps stop; end=$(($(date +%s)+120)); "
        f"while [ ! -e stop ] && [ $(date +%s) -lt $end ]; do rm -rf d; mkdir d; rm -rf d; ln -s {target} d; "
        "echo >> swaps; done"
    )
    assert (await sess.call("exec", {"command": swap, "background": True})).ok
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    n = 0
    while n < writes or time.monotonic() < deadline:
        r = await sess.call("write", {"path": f"d/f{n}.txt", "content": "RACE"})
        key = "ok" if r.ok else r.error.code
        outcomes[key] = outcomes.get(key, 0) + 1
        n += 1
    stopped = await sess.call("exec", {"command": "touch stop; sleep 0.5; wc -l < swaps"})
    assert stopped.ok, stopped
    return int(stopped.output["output"].strip()), outcomes
