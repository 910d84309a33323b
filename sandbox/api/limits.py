"""Per-tenant bounds on what the service holds or does for reads: event streams open at once,
and read requests (`logs`, `explain`, `tools`, `approvals`, `sandboxes`) per minute. Both are
`service.*` settings, the same for every tenant; past them the answer is 429 with Retry-After.
Also the request bodies one tenant's calls read at once (BODIES_PER_TENANT): more wait for a
slot, each within its connection's `service.body_timeout_s`."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from fastapi import HTTPException

from sandbox.api.tenants import Caller
from sandbox.config.models import ServiceSection

BODIES_PER_TENANT = 8  # request bodies of one tenant read at once (each up to 40 MiB)


class TenantLimits:
    """Event streams and read requests of each tenant, against `service`'s bounds."""

    def __init__(self, service: ServiceSection) -> None:
        self.service = service
        self._streams: dict[str, int] = {}
        self._reads: dict[str, deque[float]] = {}
        self._bodies: dict[str, anyio.CapacityLimiter] = {}

    @asynccontextmanager
    async def body_slot(self, who: Caller) -> AsyncIterator[None]:
        """Hold one of the tenant's BODIES_PER_TENANT body slots (waiting for one) while its body
        is read: a tenant trickling its bodies holds its own slots, never another's memory."""
        limiter = self._bodies.get(who.tenant.id)
        if limiter is None:
            limiter = self._bodies[who.tenant.id] = anyio.CapacityLimiter(BODIES_PER_TENANT)
        async with limiter:
            yield

    def bodies(self, tenant: str) -> int:
        """Bodies of `tenant` being read now."""
        limiter = self._bodies.get(tenant)
        return 0 if limiter is None else int(limiter.borrowed_tokens)

    def read(self, who: Caller) -> None:
        """Count one read request in, or refuse it (429) past service.read_requests_per_minute."""
        window = self._reads.setdefault(who.tenant.id, deque())
        now = time.monotonic()
        while window and window[0] < now - 60:
            window.popleft()
        limit = self.service.read_requests_per_minute
        if len(window) >= limit:
            retry = max(1, int(60 - (now - window[0])) + 1)
            raise HTTPException(
                429,
                f"tenant {who.tenant.id!r} made {len(window)} read requests in the last minute "
                f"(service.read_requests_per_minute is {limit})",
                headers={"Retry-After": str(retry)},
            )
        window.append(now)

    def open_stream(self, who: Caller) -> Callable[[], None]:
        """Take one of the tenant's event streams (checked and taken at once); returns the
        function that gives it back (call it exactly once, when the stream ends).

        Raises:
            HTTPException: 429 past service.max_event_streams_per_tenant.
        """
        tenant = who.tenant.id
        limit = self.service.max_event_streams_per_tenant
        if self._streams.get(tenant, 0) >= limit:
            raise HTTPException(
                429,
                f"tenant {tenant!r} has {self._streams[tenant]} event streams open "
                f"(service.max_event_streams_per_tenant is {limit}); close one",
                headers={"Retry-After": "5"},
            )
        self._streams[tenant] = self._streams.get(tenant, 0) + 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self._streams[tenant] -= 1

        return give_back

    def streams(self, tenant: str) -> int:
        """Event streams of `tenant` open now."""
        return self._streams.get(tenant, 0)
