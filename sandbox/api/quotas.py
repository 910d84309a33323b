"""Per-tenant admission, for REST and MCP alike: calls per minute (a sliding window), calls in
flight, sessions and sandboxes (429 with Retry-After otherwise), and none while stopping (503)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException

from sandbox.api.tenants import Caller
from sandbox.runtime.pool import unclaimed

if TYPE_CHECKING:
    from sandbox.api.metrics import Metrics
    from sandbox.engine.orchestrator import Orchestrator, Session


class RateWindow:
    """Calls per minute of one tenant (a sliding window) and calls in flight."""

    def __init__(self) -> None:
        self.started: deque[float] = deque()
        self.in_flight = 0


def admit(who: Caller, window: RateWindow) -> None:
    """Count a call in, or refuse it (429 with Retry-After) past max_calls_per_minute or
    max_concurrent_calls; the caller raises `in_flight` while the call runs."""
    quotas = who.tenant.quotas
    now = time.monotonic()
    while window.started and window.started[0] < now - 60:
        window.started.popleft()
    if quotas.max_calls_per_minute and len(window.started) >= quotas.max_calls_per_minute:
        retry = max(1, int(60 - (now - window.started[0])) + 1)
        raise HTTPException(
            429,
            f"tenant {who.tenant.id!r} made {len(window.started)} calls in the last minute "
            f"(tenants[].quotas.max_calls_per_minute is {quotas.max_calls_per_minute})",
            headers={"Retry-After": str(retry)},
        )
    if quotas.max_concurrent_calls and window.in_flight >= quotas.max_concurrent_calls:
        raise HTTPException(
            429,
            f"tenant {who.tenant.id!r} has {window.in_flight} calls running "
            f"(tenants[].quotas.max_concurrent_calls is {quotas.max_concurrent_calls})",
            headers={"Retry-After": "1"},
        )
    window.started.append(now)


class Admission:
    """What every call of the service passes before it runs, and what it holds while it runs.

    Args:
        state: the app's state (`stopping` is set there on SIGTERM, see api/serving.py).
        metrics: where calls in flight are counted.
    """

    def __init__(self, state: Any, metrics: Metrics) -> None:
        self.state = state
        self.metrics = metrics
        self.windows: dict[str, RateWindow] = {}
        self.open_sessions: dict[str, set[str]] = {}  # tenant -> keys used and not closed (this process)

    def rate(self, who: Caller) -> RateWindow:
        """A new call of `who`: refused while the service stops (503) or past a rate quota (429)."""
        if self.state.stopping:
            raise HTTPException(503, "the service is stopping; try again shortly", headers={"Retry-After": "5"})
        window = self.windows.setdefault(who.tenant.id, RateWindow())
        admit(who, window)
        return window

    async def session(self, orch: Orchestrator, who: Caller, session: Session) -> None:
        """max_sessions and max_sandboxes: a new session or a new sandbox only under the quota."""
        quotas = who.tenant.quotas
        mine = self.open_sessions.setdefault(who.tenant.id, set())
        if quotas.max_sessions and session.key not in mine and len(mine) >= quotas.max_sessions:
            raise HTTPException(
                429,
                f"tenant {who.tenant.id!r} has {len(mine)} open sessions (tenants[].quotas.max_sessions is "
                f"{quotas.max_sessions}); close one with DELETE /v1/sessions/{{key}}",
                headers={"Retry-After": "60"},
            )
        if quotas.max_sandboxes and session.sandboxed:
            spec = orch.manager.spec_for(session.agent, session.key)
            # a sandbox this process holds needs no engine call (a quota check per call cost one)
            if not orch.manager.known_live(spec) and not await orch.backend.exists(spec.name):
                live = [
                    s
                    # the manager's list: a pool container handed to a session shows it (labels cannot)
                    for s in await orch.manager.list()
                    if s.tenant == who.tenant.id and not unclaimed(s)  # a free pool container is no one's yet
                ]
                if len(live) >= quotas.max_sandboxes:
                    raise HTTPException(
                        429,
                        f"tenant {who.tenant.id!r} has {len(live)} sandboxes (tenants[].quotas.max_sandboxes is "
                        f"{quotas.max_sandboxes}); close a session to free one",
                        headers={"Retry-After": "60"},
                    )
        mine.add(session.key)

    @asynccontextmanager
    async def running(self, who: Caller) -> AsyncIterator[None]:
        """Count a call in flight (for max_concurrent_calls, the metrics and the drain)."""
        window = self.windows.setdefault(who.tenant.id, RateWindow())
        window.in_flight += 1
        self.metrics.in_flight.labels(who.tenant.id).inc()
        try:
            yield
        finally:
            window.in_flight -= 1
            self.metrics.in_flight.labels(who.tenant.id).dec()

    def in_flight(self) -> int:
        """Calls running now, of every tenant."""
        return sum(w.in_flight for w in self.windows.values())

    def closed(self, tenant: str, keys: list[str]) -> None:
        """Sessions closed: they no longer count toward max_sessions."""
        self.open_sessions.get(tenant, set()).difference_update(keys)
