"""Threads for the read routes' journal reads, apart from everything else.

A journal read (a logs page, the pending approvals) runs in a worker thread; in anyio's shared
default pool (40 threads) a flood of slow pages from one tenant took every thread, and
`/readyz`, the engine's calls (each a thread hop) and every other tenant's reads waited behind
it. Here each tenant's reads hold one of its own few slots (PER_TENANT) before they take one of
the pool's (TOTAL), so a tenant's reads queue behind its own; the pool's limiter is not the
default one, so reads never take a thread the engine's calls or the probes need.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")
PER_TENANT = 2  # journal reads of one tenant in threads at once; more wait for these
TOTAL = 8  # journal reads of all tenants at once (the default pool keeps its 40 for the rest)


class ReadPool:
    """Worker-thread slots for journal reads: PER_TENANT per tenant, TOTAL in all."""

    def __init__(self, per_tenant: int = PER_TENANT, total: int = TOTAL) -> None:
        self.per_tenant = per_tenant
        self.total = anyio.CapacityLimiter(total)
        self._tenants: dict[str, anyio.CapacityLimiter] = {}

    def _of(self, tenant: str) -> anyio.CapacityLimiter:
        limiter = self._tenants.get(tenant)
        if limiter is None:  # one per configured tenant at most: the caller is authenticated
            limiter = self._tenants[tenant] = anyio.CapacityLimiter(self.per_tenant)
        return limiter

    async def run(self, tenant: str, read: Callable[[], T]) -> T:
        """`read()` in a worker thread, once one of `tenant`'s slots and one of the pool's are free."""
        async with self._of(tenant):
            return await anyio.to_thread.run_sync(read, limiter=self.total)

    async def run_async(self, tenant: str, read: Callable[[], Awaitable[T]]) -> T:
        """`await read()` (a read of the shared store) once one of `tenant`'s slots and one of
        the pool's are free: a tenant's slow pages hold its own slots and pooled connections,
        never every one."""
        async with self._of(tenant), self.total:
            return await read()

    def busy(self, tenant: str) -> int:
        """Reads of `tenant` holding a slot now."""
        limiter = self._tenants.get(tenant)
        return 0 if limiter is None else int(limiter.borrowed_tokens)
