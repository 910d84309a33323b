"""A second process on the state store, for the tests that need two (tests/contract/test_state_contract.py).

Usage: python -m tests.state_worker URL STATE_DIR TENANT LIMIT COUNT LEASE_S

Opens the store, waits for a line on stdin (the go), makes COUNT concurrent reservations of one
slot under max_concurrent_calls LIMIT, prints how many were admitted as JSON, then holds them
until stdin closes (or until it is killed: the lease test kills it with SIGKILL).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio

from sandbox.config.state import parse_state_url
from sandbox.state import QuotaLimits, Reservation, open_store


async def main(url: str, state_dir: str, tenant: str, limit: int, count: int, lease_s: float) -> None:
    """See the module's docstring."""
    async with open_store(parse_state_url(url), Path(state_dir), lease_s=lease_s) as store:
        print(json.dumps({"ready": True}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        results: list[object] = []

        async def one() -> None:
            results.append(await store.reserve(tenant, QuotaLimits(max_concurrent_calls=limit)))

        async with anyio.create_task_group() as tg:
            for _ in range(count):
                tg.start_soon(one)
        admitted = sum(isinstance(r, Reservation) for r in results)
        print(json.dumps({"admitted": admitted, "refused": count - admitted}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # hold until stdin closes


if __name__ == "__main__":
    u, d, t, lim, n, lease = sys.argv[1:7]
    anyio.run(main, u, d, t, int(lim), int(n), float(lease))
