"""Per-tenant admission: calls per minute (a sliding window) and calls in flight (429 otherwise)."""

from __future__ import annotations

import time
from collections import deque

from fastapi import HTTPException

from sandbox.api.tenants import Caller


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
