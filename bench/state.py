"""Benchmark: the state store's call-path costs, SQLite against PostgreSQL, in one run.

- reserve + release of one call's quota (what Admission adds to a call with quotas), sequential;
- the same from 16 tasks over two store instances (two replicas) at once: reservations a second;
- an approval decided through one instance, until a waiter on the other wakes (PostgreSQL:
  LISTEN/NOTIFY; SQLite: the waiter reads again every 0.1 s).

PostgreSQL is a private server on loopback started from Debian's packages (tests/pg_server.py),
stopped at the end. Run: python bench/state.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from _stats import pct

from sandbox.config.state import StateUrl, parse_state_url
from sandbox.journal.approvals import Approval
from sandbox.state import QuotaLimits, Reservation, open_store
from sandbox.state.admin import migrate_store

N = 500
TASKS, EACH = 16, 50
WAKES = 30
LIMITS = QuotaLimits(max_concurrent_calls=1000, max_calls_per_minute=0)


async def sequential(url: StateUrl, state_dir: Path) -> list[float]:
    out = []
    async with open_store(url, state_dir, owner="bench@elsewhere|b|1|1") as store:
        for i in range(N + 20):
            start = time.perf_counter()
            r = await store.reserve("t", LIMITS)
            assert isinstance(r, Reservation)
            await store.release(r)
            if i >= 20:
                out.append((time.perf_counter() - start) * 1000)
    return out


async def concurrent(url: StateUrl, state_dir: Path) -> float:
    async with (
        open_store(url, state_dir, owner="a@elsewhere|b|1|1") as a,
        open_store(url, state_dir, owner="b@elsewhere|b|1|1") as b,
    ):

        async def worker(store: object) -> None:
            for _ in range(EACH):
                r = await store.reserve("t", LIMITS)  # type: ignore[attr-defined]
                await store.release(r)  # type: ignore[attr-defined]

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(TASKS):
                tg.start_soon(worker, a if i % 2 else b)
        return TASKS * EACH / (time.perf_counter() - start)


async def wake(url: StateUrl, state_dir: Path) -> list[float]:
    out = []
    async with (
        open_store(url, state_dir, owner="a@elsewhere|b|1|1") as a,
        open_store(url, state_dir, owner="b@elsewhere|b|1|1") as b,
    ):
        for i in range(WAKES):
            aid = f"a-{i}"
            await a.add_approval(
                Approval(aid, "c", "t", "agent:m:s", "m", "exec", {}, "pending", "", time.time(), None)
            )
            woke: list[float] = []

            async def waiter(approval_id: str = aid, into: list[float] = woke) -> None:
                await a.wait_decided(approval_id, 30)
                into.append(time.perf_counter())

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.sleep(0.05)
                decided_at = time.perf_counter()
                await b.decide(aid, "approved")
            out.append((woke[0] - decided_at) * 1000)
    return out


async def run(kind: str, url: StateUrl, state_dir: Path) -> tuple[str, list[float], float, list[float]]:
    await migrate_store(url, state_dir)
    return kind, await sequential(url, state_dir), await concurrent(url, state_dir), await wake(url, state_dir)


def main() -> None:
    from tests.pg_server import create_database, start_server

    server = start_server()
    try:
        pg = parse_state_url(create_database(server))
        with tempfile.TemporaryDirectory() as tmp:
            rows = [
                anyio.run(run, "sqlite (state_dir)", parse_state_url("sqlite:"), Path(tmp) / "lite"),
                anyio.run(run, "postgresql (loopback)", pg, Path(tmp) / "pg"),
            ]
    finally:
        server.stop()
    print(f"{'store':<24}{'reserve+release p50':>21}{'p95':>8}{'2 replicas, /s':>16}{'wake p50':>10}{'p95':>8}")
    for kind, seq, rate, wakes in rows:
        print(
            f"{kind:<24}{pct(seq, 50):>18.2f} ms{pct(seq, 95):>8.2f}{rate:>16,.0f}"
            f"{pct(wakes, 50):>7.1f} ms{pct(wakes, 95):>8.1f}"
        )


if __name__ == "__main__":
    main()
