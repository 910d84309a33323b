"""`/readyz`: cheap probes with a bounded wait, that never block other requests.

The journal check is `Journal.ping()` (one trivial read, in a thread: no integrity check and no
row count, which took 5 s per probe on a journal of a million events); the engine check asks for
the default agent's image. Each runs as one background task at a time (a probe that arrives while
one runs waits for that one), and the probe waits at most PROBE_WAIT_S for it: an engine that
accepts connections but never answers makes /readyz 503 within that bound, and repeated probes
do not pile up threads stuck on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from sandbox.errors import SandboxError

PROBE_WAIT_S = 1.5  # under the 2 s a probe of a hung engine may take
# an outcome this recent is answered again without a new check: /readyz needs no token, and a
# flood of probes must not become a flood of engine calls (a failing one costs a full GC there)
FRESH_S = 1.0


class SingleFlight:
    """One check at a time in the background; callers wait a bounded time for its outcome."""

    def __init__(self, name: str, check: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self._check = check
        self._done: anyio.Event | None = None  # set when the running check ends
        self._outcome = "not checked yet"
        self._checked_at = float("-inf")  # anyio.current_time() of the last outcome

    async def _run(self, done: anyio.Event) -> None:
        try:
            await self._check()
            self._outcome = "ok"
        except Exception as exc:  # any failure is "not ready", said plainly
            self._outcome = f"failed: {exc.message if isinstance(exc, SandboxError) else exc}"
        finally:
            self._checked_at = anyio.current_time()
            self._done = None
            done.set()

    async def outcome(self, spawn: Callable[..., Any], wait_s: float = PROBE_WAIT_S) -> str:
        """ "ok" or "failed: ..." of a check started now (or the one running), waiting at most
        `wait_s`; a check still running then is "failed: no answer within ..."."""
        done = self._done
        if done is None and anyio.current_time() - self._checked_at < FRESH_S:
            return self._outcome
        if done is None:
            done = self._done = anyio.Event()
            spawn(self._run, done)
        with anyio.move_on_after(wait_s):
            await done.wait()
            return self._outcome
        return f"failed: no answer within {wait_s} s"
