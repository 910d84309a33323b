"""Per-tenant admission, for REST and MCP alike: calls per minute (a sliding window), calls in
flight, sessions and sandboxes (429 with Retry-After otherwise), and none while stopping (503).

Every quota is *reserved*: checked and taken in one synchronous step, with no await between the
check and the take, so that simultaneous requests cannot all pass one check (four requests on
new sessions under `max_concurrent_calls: 1` ran three at once when the count was raised only
after the body was read). What is taken is given back when the call ends or the request is
refused. A batch takes one call per item toward both call quotas.

With a shared store (`state.url: postgresql://...`, docs/state.md) every quota is counted there
instead, across every replica: the call quotas and the session key in one transaction (given
back when the call ends or is refused), and a sandbox about to be made under the tenant's turn,
with the engine listed inside it (so two replicas cannot both make the last one).

A new session's key is *claimed* until a request on it is admitted: every request that reaches
the key meanwhile shares the claim, and the key goes back only when the last of them is
refused (one refused request must not free a key another is running on). A sandbox being made
is reserved until the call ends, and then as long as this process's manager holds it live: a
request that read the engine's list before the sandbox existed still counts it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import HTTPException
from loguru import logger

from sandbox.api.tenants import Caller
from sandbox.errors import SandboxError
from sandbox.runtime.protocol import unclaimed, under_pool_name
from sandbox.state import QuotaLimits, QuotaStore, Refused, Reservation
from sandbox.state.protocol import SandboxMakes

if TYPE_CHECKING:
    from sandbox.api.metrics import Metrics
    from sandbox.engine.orchestrator import Orchestrator, Session
    from sandbox.runtime.spec import SandboxSpec


@dataclass
class TenantUse:
    """What one tenant holds now."""

    started: deque[float] = field(default_factory=deque)  # call starts in the last minute
    in_flight: int = 0  # calls running (a parallel batch counts its widest wave)
    sessions: set[str] = field(default_factory=set)  # keys used and not closed (this process)
    creating: dict[str, int] = field(default_factory=dict)  # sandbox scope keys being made -> requests
    claims: dict[str, Claim] = field(default_factory=dict)  # session keys taken, no request admitted yet
    made: dict[str, SandboxSpec] = field(default_factory=dict)  # made by a call that ended (scope key)


@dataclass(eq=False)
class Claim:
    """A new session key taken by requests none of which was admitted yet (`holders` of them)."""

    key: str
    holders: int = 1


@dataclass
class Ticket:
    """What one admitted request took (given back by `Admission.release`)."""

    tenant: str
    starts: list[float] = field(default_factory=list)
    slots: int = 0
    claim: Claim | None = None
    sandbox: SandboxSpec | None = None
    shared: Reservation | None = None  # what the shared store holds for it (state.url: postgresql)
    make: str | None = None  # the shared store's count of the sandbox it makes (SandboxMakes)
    max_sessions: int = 0  # the tenant's limit when it was admitted (a shared session claim's confirm)


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
        # the shared store, while the service holds one open (api/app.py): the quotas live there
        self.store: QuotaStore | None = None
        self.makes: SandboxMakes | None = None

    def _of(self, tenant: str) -> TenantUse:
        return self.use.setdefault(tenant, TenantUse())

    def precheck(self, who: Caller) -> None:
        """Refuse early (503 while stopping, 429 past the rate) without taking anything: for a
        route that would otherwise read a body first."""
        self._stopping()
        if self.store is None:  # a shared store's window is read in admit(), in its transaction
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
        quotas = who.tenant.quotas
        shared = self.store is not None and bool(
            quotas.max_concurrent_calls or quotas.max_calls_per_minute or quotas.max_sessions
        )
        ticket = await self._reserve(who, calls, slots, session.key) if shared else self._take_calls(who, calls, slots)
        try:
            if not (shared and quotas.max_sessions):  # else the store counted it with the calls
                self._take_session(who, session, ticket)
            await self._take_sandbox(orch, who, session, ticket)
            await self._confirm(ticket)
        except BaseException:  # refused (or cancelled) before it ran: everything goes back
            self._refund(ticket)
            await self._give_back(ticket, refund=True)
            raise
        try:
            yield
        finally:
            self._release(ticket, orch)
            await self._give_back(ticket, refund=False)

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

    async def _reserve(self, who: Caller, calls: int, slots: int, key: str) -> Ticket:
        """The call quotas (and the session key toward max_sessions) through the shared store:
        checked and taken in one transaction there, so a burst split across replicas never
        passes them."""
        assert self.store is not None
        self._stopping()
        quotas = who.tenant.quotas
        self._never_fits(who, calls, slots)
        limits = QuotaLimits(
            quotas.max_concurrent_calls or 0, quotas.max_calls_per_minute or 0, quotas.max_sessions or 0
        )
        # a quota that is not set takes no row (a tenant with max_sessions alone writes no starts)
        counted_calls = calls if limits.max_calls_per_minute else 0
        counted_slots = slots if limits.max_concurrent_calls else 0
        with anyio.CancelScope(shield=True):  # what a committed reserve took is always given back
            outcome = await self.store.reserve(
                who.tenant.id, limits, calls=counted_calls, slots=counted_slots, session=key
            )
        if isinstance(outcome, Refused):
            if outcome.quota == "max_sessions":
                raise _refuse(
                    429,
                    f"tenant {who.tenant.id!r} has {outcome.held} open sessions (tenants[].quotas.max_sessions is "
                    f"{outcome.limit}; counted across replicas); close one with DELETE /v1/sessions/{{key}}",
                    outcome.retry_after_s,
                )
            if outcome.quota == "max_calls_per_minute":
                raise _refuse(
                    429,
                    f"tenant {who.tenant.id!r} made {outcome.held} calls in the last minute "
                    f"(tenants[].quotas.max_calls_per_minute is {outcome.limit}; counted across replicas)",
                    outcome.retry_after_s,
                )
            raise _refuse(
                429,
                f"tenant {who.tenant.id!r} has {outcome.held} calls running "
                f"(tenants[].quotas.max_concurrent_calls is {outcome.limit}; counted across replicas)",
                outcome.retry_after_s,
            )
        use = self._of(who.tenant.id)
        use.in_flight += slots  # this process's calls: what a stopping service waits for
        self.metrics.in_flight.labels(who.tenant.id).inc(slots)
        return Ticket(who.tenant.id, slots=slots, shared=outcome, max_sessions=limits.max_sessions)

    def _never_fits(self, who: Caller, calls: int, slots: int) -> None:
        """A batch larger than a quota can never run: 400, whatever is held now."""
        quotas = who.tenant.quotas
        if quotas.max_calls_per_minute and calls > quotas.max_calls_per_minute:
            raise _refuse(
                400,
                f"a batch of {calls} calls can never fit tenant {who.tenant.id!r}'s "
                f"tenants[].quotas.max_calls_per_minute ({quotas.max_calls_per_minute}); split it",
                None,
            )
        if quotas.max_concurrent_calls and slots > quotas.max_concurrent_calls:
            raise _refuse(
                400,
                f"a parallel batch of {slots} calls can never fit tenant {who.tenant.id!r}'s "
                f"tenants[].quotas.max_concurrent_calls ({quotas.max_concurrent_calls}); "
                "run it sequentially or split it",
                None,
            )

    async def _give_back(self, ticket: Ticket, *, refund: bool) -> None:
        """The shared store's part goes back, even when the call was cancelled. If the store
        cannot be reached, the store gives it back once it answers again (or, if this replica
        dies first, its lease runs out)."""
        reservation, ticket.shared = ticket.shared, None
        make, ticket.make = ticket.make, None
        with anyio.CancelScope(shield=True):  # each part on its own: one failing never keeps the other
            if make is not None and self.makes is not None:
                try:
                    await self.makes.release_sandbox(make)
                except SandboxError as exc:  # the store retries it with its lease renewals
                    logger.bind(tenant=ticket.tenant, error=exc.message[:200]).warning("sandbox_make_not_given_back")
            if reservation is not None and self.store is not None:
                try:
                    await (self.store.refund if refund else self.store.release)(reservation)
                except SandboxError as exc:
                    logger.bind(tenant=ticket.tenant, error=exc.message[:200]).warning("quota_not_given_back")

    def _take_session(self, who: Caller, session: Session, ticket: Ticket) -> None:
        limit = who.tenant.quotas.max_sessions
        if not limit:
            return  # nothing to count against: every key a tenant ever used would stay in the set
        use = self._of(who.tenant.id)
        claim = use.claims.get(session.key)
        if claim is not None:  # another request took it and is not admitted yet: share its claim
            claim.holders += 1
            ticket.claim = claim
            return
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
        ticket.claim = use.claims[session.key] = Claim(session.key)

    async def _confirm(self, ticket: Ticket) -> None:
        """Admitted: a key this request claimed is the tenant's session now (until closed)."""
        if ticket.shared is not None and ticket.shared.session is not None and self.store is not None:
            limit = ticket.max_sessions
            if not await self.store.confirm_session(ticket.shared, limit):
                raise _refuse(
                    429,
                    f"tenant {ticket.tenant!r} has {limit} open sessions (tenants[].quotas.max_sessions is {limit}; "
                    "counted across replicas); close one with DELETE /v1/sessions/{key}",
                    60,
                )
            ticket.shared = dataclasses.replace(ticket.shared, session=None)  # open now: a refund keeps it
        if ticket.claim is not None:
            use = self._of(ticket.tenant)
            if use.claims.get(ticket.claim.key) is ticket.claim:
                del use.claims[ticket.claim.key]
            ticket.claim = None

    async def _take_sandbox(self, orch: Orchestrator, who: Caller, session: Session, ticket: Ticket) -> None:
        """max_sandboxes: the engine's list is read first (an await); the check against it and
        against the sandboxes other requests are making now, and the take, are one step."""
        limit = who.tenant.quotas.max_sandboxes
        if not limit or not session.sandboxed:
            return
        spec = orch.manager.spec_for(session.agent, session.key)
        if orch.manager.known_live(spec):  # this process holds it: no engine call, nothing to make
            return
        if self.makes is not None:
            await self._take_shared_sandbox(orch, who, spec, ticket)
            return
        # the tenant's own (the engine filters: a neighbour's thousand sandboxes cost it nothing);
        # the manager's list: a pool container handed to a session shows it (labels cannot); a
        # free pool container is no one's yet
        listed = await orch.manager.list(tenant=who.tenant.id)
        live = {s.scope_key for s in listed if s.tenant == who.tenant.id and not unclaimed(s)}
        use = self._of(who.tenant.id)
        self._forget_gone(orch, use)
        held = live | set(use.creating) | set(use.made)
        if spec.scope_key not in held and len(held) >= limit:
            raise _refuse(
                429,
                f"tenant {who.tenant.id!r} has {len(held)} sandboxes, live or being made "
                f"(tenants[].quotas.max_sandboxes is {limit}); close a session to free one",
                60,
            )
        if spec.scope_key not in live:
            use.creating[spec.scope_key] = use.creating.get(spec.scope_key, 0) + 1
            ticket.sandbox = spec

    async def _take_shared_sandbox(self, orch: Orchestrator, who: Caller, spec: SandboxSpec, ticket: Ticket) -> None:
        """max_sandboxes across replicas: the store holds the tenant's turn while the engine is
        listed (SandboxMakes.take_sandbox)."""
        assert self.makes is not None
        tenant = who.tenant.id

        # a sandbox is known by its container name here: a pool member another replica handed
        # out carries its session's name, while its labels (and this process's claim files)
        # still say `pool`; one under its pool name is no one's yet
        async def live() -> set[str]:
            listed = await orch.manager.list(tenant=tenant)
            return {s.name for s in listed if s.tenant == tenant and not under_pool_name(s)}

        limit = who.tenant.quotas.max_sandboxes
        outcome = await self.makes.take_sandbox(tenant, spec.name, limit, live)
        if isinstance(outcome, Refused):
            raise _refuse(
                429,
                f"tenant {tenant!r} has {outcome.held} sandboxes, live or being made (tenants[].quotas.max_sandboxes "
                f"is {limit}; counted across replicas); close a session to free one",
                outcome.retry_after_s,
            )
        ticket.make = outcome

    @staticmethod
    def _forget_gone(orch: Orchestrator, use: TenantUse) -> None:
        """Sandboxes made by ended calls stay reserved while the manager holds them live (an
        engine list read before they existed does not show them); after that the list does."""
        for key, spec in list(use.made.items()):
            if not orch.manager.known_live(spec):
                del use.made[key]

    def _release(self, ticket: Ticket, orch: Orchestrator | None = None) -> None:
        """The call ended (or was refused): its concurrency slots go back, and its sandbox
        reservation, unless the call made the sandbox (then it is kept in `made`)."""
        use = self._of(ticket.tenant)
        if ticket.slots:
            use.in_flight -= ticket.slots
            self.metrics.in_flight.labels(ticket.tenant).dec(ticket.slots)
            ticket.slots = 0
        if ticket.sandbox is not None:
            key = ticket.sandbox.scope_key
            left = use.creating.get(key, 1) - 1
            if left > 0:
                use.creating[key] = left
            else:
                use.creating.pop(key, None)
            if orch is not None and orch.manager.known_live(ticket.sandbox):
                use.made[key] = ticket.sandbox
            ticket.sandbox = None
        if orch is not None:
            self._forget_gone(orch, use)

    def _refund(self, ticket: Ticket) -> None:
        """The request was refused: everything it took goes back, its call starts too."""
        use = self._of(ticket.tenant)
        for started in ticket.starts:
            with contextlib.suppress(ValueError):  # already out of the window
                use.started.remove(started)
        ticket.starts = []
        claim = ticket.claim
        if claim is not None and use.claims.get(claim.key) is claim:
            claim.holders -= 1
            if claim.holders <= 0:  # the last request on a key none was admitted on: it goes back
                del use.claims[claim.key]
                use.sessions.discard(claim.key)
        ticket.claim = None
        self._release(ticket)

    def in_flight(self) -> int:
        """Calls running now, of every tenant."""
        return sum(u.in_flight for u in self.use.values())

    async def closed(self, tenant: str, keys: list[str]) -> None:
        """Sessions closed: they no longer count toward max_sessions (in the shared store too)."""
        use = self._of(tenant)
        use.sessions.difference_update(keys)
        for key in keys:
            use.claims.pop(key, None)
        if self.store is not None and keys:
            with anyio.CancelScope(shield=True):
                try:
                    await self.store.close_sessions(tenant, keys)
                except SandboxError as exc:  # the store retries it with its lease renewals
                    logger.bind(tenant=tenant, error=exc.message[:200]).warning("sessions_not_closed_in_store")
