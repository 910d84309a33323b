"""Concurrency limits at several levels, with one FIFO wait queue in front of them.

A call needs a permit at every level that applies to it: global, its category, its tool, its
skill, and the same levels again for its tenant. When more than one tenant is configured, a
tenant's share of every level is below the level's limit (so one tenant never holds every permit
while others wait), and waiting calls are served round-robin across tenants, in arrival order
within one tenant; a call is only overtaken by a later one that needs none of the levels it is
waiting for. Permits are released on every exit path, cancellation included.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from sandbox.config.models import LimitsConfig
from sandbox.errors import ErrorCode, SandboxError

Level = tuple[str, ...]


@dataclass(eq=False)
class _Waiter:
    tenant: str
    levels: list[Level]
    granted: anyio.Event = field(default_factory=anyio.Event)


def tenant_share(limit: int) -> int:
    """A tenant's share of a level it shares with other tenants: about half, always below the limit."""
    return max(1, min(limit - 1, -(-limit // 2)))


class Limiter:
    """Permits per level, handed out in FIFO order.

    Args:
        config: `limits` from the config.
        tool_limits: per-tool limits declared by tool specs (config `limits.tools` wins).
        multi_tenant: whether several tenants share these permits (their shares are then capped).
    """

    def __init__(
        self, config: LimitsConfig, tool_limits: dict[str, int] | None = None, *, multi_tenant: bool = False
    ) -> None:
        self.config = config
        self.multi_tenant = multi_tenant
        self._last_served: str | None = None
        self._ring: list[str] = []  # tenants in the order they first queued: the round-robin order
        self._tool_limits = {**(tool_limits or {}), **config.tools}
        self._in_use: dict[Level, int] = {}
        self._all_limits: dict[Level, int] = {}  # every level seen so far, with its limit
        self._queue: deque[_Waiter] = deque()

    def declare_tool(self, tool: str, limit: int | None) -> None:
        """Add a tool's own max_concurrency (config `limits.tools` still wins)."""
        if limit and tool not in self.config.tools:
            self._tool_limits[tool] = limit

    @property
    def tenant_limit(self) -> int:
        """Permits one tenant may hold at once: configured, else half the global limit."""
        configured = self.config.tenant_concurrency
        return configured if configured else max(1, self.config.global_concurrency // 2)

    def levels(self, *, tenant: str, category: str, tool: str, skill: str | None = None) -> list[tuple[Level, int]]:
        """Every (level, limit) a call needs a permit at."""
        out: list[tuple[Level, int]] = [(("global",), self.config.global_concurrency)]
        cat = self.config.categories.get(category)
        tool_limit = self._tool_limits.get(tool)
        out.append((("tenant", tenant), self.tenant_limit))
        for scope in ((), ("tenant", tenant)):
            share = tenant_share if scope and self.multi_tenant else (lambda limit: limit)
            if cat:
                out.append(((*scope, "category", category), share(cat)))
            if tool_limit:
                out.append(((*scope, "tool", tool), share(tool_limit)))
            if skill and (skill_limit := self._tool_limits.get(f"skill:{skill}")):
                out.append(((*scope, "skill", skill), share(skill_limit)))
        return out

    def in_use(self, level: Level) -> int:
        """Permits held at a level (for tests and status)."""
        return self._in_use.get(level, 0)

    @property
    def waiting(self) -> int:
        """Calls in the queue."""
        return len(self._queue)

    def _fits(self, levels: list[Level], limits: dict[Level, int], reserved: dict[Level, int]) -> bool:
        return all(self._in_use.get(lv, 0) + reserved.get(lv, 0) < limits[lv] for lv in levels)

    def _take(self, levels: list[Level]) -> None:
        for lv in levels:
            self._in_use[lv] = self._in_use.get(lv, 0) + 1

    def _release(self, levels: list[Level]) -> None:
        for lv in levels:
            self._in_use[lv] -= 1
        self._wake()

    def _round_robin(self) -> list[_Waiter]:
        # Interleave the tenants' queues (first of each, then second of each, ...), starting
        # with the tenant after the one served last; each tenant's own order stays FIFO.
        by_tenant: dict[str, list[_Waiter]] = {}
        for waiter in self._queue:
            by_tenant.setdefault(waiter.tenant, []).append(waiter)
        ring = self._ring
        start = ring.index(self._last_served) + 1 if self._last_served in ring else 0
        tenants = [t for t in ring[start:] + ring[:start] if t in by_tenant]
        depth = max((len(q) for q in by_tenant.values()), default=0)
        return [by_tenant[t][i] for i in range(depth) for t in tenants if i < len(by_tenant[t])]

    def _wake(self) -> None:
        # Serve the queue round-robin across tenants. A waiter that cannot start reserves a place
        # only on the levels that are full for it, so it holds back later waiters on those alone.
        if self._in_use.get(("global",), 0) >= self.config.global_concurrency:
            return  # every call needs a global permit: with none free nobody can start
        reserved: dict[Level, int] = {}
        for waiter in self._round_robin():
            if self._fits(waiter.levels, self._all_limits, reserved):
                self._queue.remove(waiter)
                self._take(waiter.levels)
                self._last_served = waiter.tenant
                waiter.granted.set()
                continue
            for lv in waiter.levels:
                if self._in_use.get(lv, 0) + reserved.get(lv, 0) >= self._all_limits[lv]:
                    reserved[lv] = reserved.get(lv, 0) + 1

    @asynccontextmanager
    async def permit(self, *, tenant: str, category: str, tool: str, skill: str | None = None) -> AsyncIterator[float]:
        """Hold a permit at every level for the duration of the block; yields the seconds waited.

        Raises:
            SandboxError: QUEUE_FULL when the queue is at max_depth; QUEUE_TIMEOUT after max_wait_s.
        """
        pairs = self.levels(tenant=tenant, category=category, tool=tool, skill=skill)
        limits = dict(pairs)
        self._all_limits.update(limits)
        levels = [lv for lv, _ in pairs]
        start = anyio.current_time()
        if not self._queue and self._fits(levels, limits, {}):
            self._take(levels)
        else:
            if len(self._queue) >= self.config.queue.max_depth:
                raise SandboxError(
                    ErrorCode.QUEUE_FULL,
                    f"{len(self._queue)} calls are already waiting (limits.queue.max_depth); try again later",
                    waiting=len(self._queue),
                )
            waiter = _Waiter(tenant, levels)
            if tenant not in self._ring:
                self._ring.append(tenant)
            self._queue.append(waiter)
            if all(self._in_use.get(lv, 0) < limits[lv] for lv in levels):
                self._wake()  # it may fit around earlier waiters' reservations; with a level full it cannot
            try:
                with anyio.fail_after(self.config.queue.max_wait_s):
                    await waiter.granted.wait()
            except BaseException as exc:
                if waiter.granted.is_set():
                    self._release(levels)  # granted and cancelled at once: give it back
                else:
                    self._queue.remove(waiter)
                    # its reservations may have held back later waiters, but only on levels with
                    # room: when every level it needed is full, nobody can start now anyway
                    if any(self._in_use.get(lv, 0) < self._all_limits[lv] for lv in levels):
                        self._wake()
                if isinstance(exc, TimeoutError):
                    raise SandboxError(
                        ErrorCode.QUEUE_TIMEOUT,
                        f"waited {self.config.queue.max_wait_s:g}s for a free slot (limits); try again",
                    ) from None
                raise
        try:
            yield anyio.current_time() - start
        finally:
            self._release(levels)
