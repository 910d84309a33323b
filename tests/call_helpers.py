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
    sess: Any, target: str, *, writes: int = 60, seconds: float = 4.0, min_swaps: int = 10
) -> tuple[int, dict[str, int]]:
    """A background loop in the sandbox swaps folder `d` for a link to `target` and back while
    the file tools write into `d/`: at least `writes` writes (a slow machine makes fewer in a
    given time), for at least `seconds`, and until the loop has swapped more than `min_swaps`
    times (gVisor on a loaded machine swapped 10 times in 288 writes; looked at every 20 writes,
    90 s at most). Returns how many swaps happened meanwhile and the writes' outcomes."""
    import time

    swap = (
        "rm -f swaps stop; end=$(($(date +%s)+180)); "
        f"while [ ! -e stop ] && [ $(date +%s) -lt $end ]; do rm -rf d; mkdir d; rm -rf d; ln -s {target} d; "
        "echo >> swaps; done"
    )
    assert (await sess.call("exec", {"command": swap, "background": True})).ok

    async def swapped() -> int:
        counted = await sess.call("exec", {"command": "wc -l < swaps 2>/dev/null || echo 0"})
        return int(counted.output["output"].strip() or 0) if counted.ok else 0

    outcomes: dict[str, int] = {}
    started = time.monotonic()
    n = 0
    while True:
        enough = n >= writes and n % 20 == 0 and time.monotonic() >= started + seconds
        if enough and (time.monotonic() >= started + 90 or await swapped() > min_swaps):
            break
        r = await sess.call("write", {"path": f"d/f{n}.txt", "content": "RACE"})
        key = "ok" if r.ok else r.error.code
        outcomes[key] = outcomes.get(key, 0) + 1
        n += 1
    stopped = await sess.call("exec", {"command": "touch stop; sleep 0.5; wc -l < swaps"})
    assert stopped.ok, stopped
    return int(stopped.output["output"].strip()), outcomes
