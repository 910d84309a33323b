"""Per-tenant admission, for REST and MCP alike: calls per minute (a sliding window), calls in
flight, sessions and sandboxes (429 with Retry-After otherwise), and none while stopping (503).

Every quota is *reserved*: checked and taken in one synchronous step, with no await between the
check and the take, so that simultaneous requests cannot all pass one check (four requests on
new sessions under `max_concurrent_calls: 1` ran three at once when the count was raised only
after the body was read). What is taken is given back when the call ends or the request is
refused. A batch takes one call per item toward both call quotas.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException

from sandbox.api.tenants import Caller
from sandbox.runtime.docker.pool import unclaimed

if TYPE_CHECKING:
    from sandbox.api.metrics import Metrics
    from sandbox.engine.orchestrator import Orchestrator, Session


@dataclass
class TenantUse:
    """What one tenant holds now."""

    started: deque[float] = field(default_factory=deque)  # call starts in the last minute
    in_flight: int = 0  # calls running (a parallel batch counts its widest wave)
    sessions: set[str] = field(default_factory=set)  # keys used and not closed (this process)
    creating: dict[str, int] = field(default_factory=dict)  # sandbox scope keys being made -> requests


@dataclass
class Ticket:
    """What one admitted request took (given back by `Admission.release`)."""

    tenant: str
    starts: list[float] = field(default_factory=list)
    slots: int = 0
    new_session: str | None = None
    sandbox: str | None = None


def _refuse(status: int, detail: str, retry_s: int | None) -> HTTPException:
    return HTTPException(status, detail, headers={"Retry-After": str(retry_s)} if retry_s else None)


class Admission:
    """What every call of the service passes before it runs, and what it holds while it runs.

    Args:
        state: the app's state (`stopping` is set there on SIGTERM, see api/serving.py).
        metrics: where calls in flight are counted.
    """

    def __init__(self, state: Any, metrics: Metrics) -> None:
        self.state = state
        self.metrics = metrics
        self.use: dict[str, TenantUse] = {}

    def _of(self, tenant: str) -> TenantUse:
        return self.use.setdefault(tenant, TenantUse())

    def precheck(self, who: Caller) -> None:
        """Refuse early (503 while stopping, 429 past the rate) without taking anything: for a
        route that would otherwise read a body first."""
        self._stopping()
        self._rate(who, self._of(who.tenant.id), 1)

    @asynccontextmanager
    async def admit(
        self, orch: Orchestrator, who: Caller, session: Session, *, calls: int = 1, slots: int = 1
    ) -> AsyncIterator[None]:
        """Hold `calls` toward max_calls_per_minute, `slots` toward max_concurrent_calls, the
        session toward max_sessions and its sandbox toward max_sandboxes while the body runs.

        Raises:
            HTTPException: 503 while stopping; 429 past a quota; 400 for a batch that can never
                fit one (split it, or run it sequentially).
        """
        ticket = self._take_calls(who, calls, slots)
        try:
            self._take_session(who, session, ticket)
            await self._take_sandbox(orch, who, session, ticket)
        except BaseException:  # refused (or cancelled) before it ran: everything goes back
            self._refund(ticket)
            raise
        try:
            yield
        finally:
            self._release(ticket)

    def _stopping(self) -> None:
        if self.state.stopping:
            raise _refuse(503, "the service is stopping; try again shortly", 5)

    def _rate(self, who: Caller, use: TenantUse, calls: int) -> None:
        limit = who.tenant.quotas.max_calls_per_minute
        if not limit:
            return
        now = time.monotonic()
        while use.started and use.started[0] < now - 60:
            use.started.popleft()
        if calls > limit:
            raise _refuse(
                400,
                f"a batch of {calls} calls can never fit tenant {who.tenant.id!r}'s "
                f"tenants[].quotas.max_calls_per_minute ({limit}); split it",
                None,
            )
        if len(use.started) + calls > limit:
            retry = max(1, int(60 - (now - use.started[0])) + 1) if use.started else 1
            raise _refuse(
                429,
                f"tenant {who.tenant.id!r} made {len(use.started)} calls in the last minute "
                f"(tenants[].quotas.max_calls_per_minute is {limit})",
                retry,
            )

    def _take_calls(self, who: Caller, calls: int, slots: int) -> Ticket:
        """Stopping, the rate and the concurrency: checked and taken at once (no await)."""
        self._stopping()
        use = self._of(who.tenant.id)
        self._rate(who, use, calls)
        limit = who.tenant.quotas.max_concurrent_calls
        if limit and slots > limit:
            raise _refuse(
                400,
                f"a parallel batch of {slots} calls can never fit tenant {who.tenant.id!r}'s "
                f"tenants[].quotas.max_concurrent_calls ({limit}); run it sequentially or split it",
                None,
            )
        if limit and use.in_flight + slots > limit:
            raise _refuse(
                429,
                f"tenant {who.tenant.id!r} has {use.in_flight} calls running "
                f"(tenants[].quotas.max_concurrent_calls is {limit})",
                1,
            )
        now = time.monotonic()
        ticket = Ticket(who.tenant.id, starts=[now] * calls, slots=slots)
        use.started.extend(ticket.starts)
        use.in_flight += slots
        self.metrics.in_flight.labels(who.tenant.id).inc(slots)
        return ticket

    def _take_session(self, who: Caller, session: Session, ticket: Ticket) -> None:
        use = self._of(who.tenant.id)
        limit = who.tenant.quotas.max_sessions
        if session.key in use.sessions:
            return
        if limit and len(use.sessions) >= limit:
            raise _refuse(
                429,
                f"tenant {who.tenant.id!r} has {len(use.sessions)} open sessions (tenants[].quotas.max_sessions is "
                f"{limit}); close one with DELETE /v1/sessions/{{key}}",
                60,
            )
        use.sessions.add(session.key)
        ticket.new_session = session.key

    async def _take_sandbox(self, orch: Orchestrator, who: Caller, session: Session, ticket: Ticket) -> None:
        """max_sandboxes: the engine's list is read first (an await); the check against it and
        against the sandboxes other requests are making now, and the take, are one step."""
        limit = who.tenant.quotas.max_sandboxes
        if not limit or not session.sandboxed:
            return
        spec = orch.manager.spec_for(session.agent, session.key)
        if orch.manager.known_live(spec):  # this process holds it: no engine call, nothing to make
            return
        listed = await orch.manager.list()
        # the manager's list: a pool container handed to a session shows it (labels cannot); a
        # free pool container is no one's yet
        live = {s.scope_key for s in listed if s.tenant == who.tenant.id and not unclaimed(s)}
        use = self._of(who.tenant.id)
        held = live | set(use.creating)
        if spec.scope_key not in held and len(held) >= limit:
            raise _refuse(
                429,
                f"tenant {who.tenant.id!r} has {len(held)} sandboxes, live or being made "
                f"(tenants[].quotas.max_sandboxes is {limit}); close a session to free one",
                60,
            )
        if spec.scope_key not in live:
            use.creating[spec.scope_key] = use.creating.get(spec.scope_key, 0) + 1
            ticket.sandbox = spec.scope_key

    def _release(self, ticket: Ticket) -> None:
        """The call ended: its concurrency slots and its sandbox reservation go back (the sandbox
        is live now, and counted from the engine's list, or it was never made)."""
        use = self._of(ticket.tenant)
        if ticket.slots:
            use.in_flight -= ticket.slots
            self.metrics.in_flight.labels(ticket.tenant).dec(ticket.slots)
            ticket.slots = 0
        if ticket.sandbox is not None:
            left = use.creating.get(ticket.sandbox, 1) - 1
            if left > 0:
                use.creating[ticket.sandbox] = left
            else:
                use.creating.pop(ticket.sandbox, None)
            ticket.sandbox = None

    def _refund(self, ticket: Ticket) -> None:
        """The request was refused: everything it took goes back, its call starts too."""
        use = self._of(ticket.tenant)
        for started in ticket.starts:
            with contextlib.suppress(ValueError):  # already out of the window
                use.started.remove(started)
        ticket.starts = []
        if ticket.new_session is not None:
            use.sessions.discard(ticket.new_session)
            ticket.new_session = None
        self._release(ticket)

    def in_flight(self) -> int:
        """Calls running now, of every tenant."""
        return sum(u.in_flight for u in self.use.values())

    def closed(self, tenant: str, keys: list[str]) -> None:
        """Sessions closed: they no longer count toward max_sessions."""
        self._of(tenant).sessions.difference_update(keys)
