"""Benchmark: the state store's call-path costs, SQLite against PostgreSQL, in one run.

- reserve + release of one call's quota (what Admission adds to a call with quotas), sequential;
- the same from 16 tasks over two store instances (two replicas) at once: reservations a second;
- an approval decided through one instance, until a waiter on the other wakes (PostgreSQL:
  LISTEN/NOTIFY; SQLite: the waiter reads again every 0.1 s);
- the journal: a call's commit before its handler runs (append + commit barrier), alone and
  while the journal is shipped to PostgreSQL (state/shipping.py), appends a second, and how
  fast the shipper moves events into the shared table;
- calls a second through one `sandbox serve` replica against two on one PostgreSQL (host mode
  `read`, 16 clients split across the replicas: the shared store's cost and whether a second
  replica adds throughput on this machine).

PostgreSQL is a private server on loopback started from Debian's packages (tests/pg_server.py),
stopped at the end. Run: python bench/state.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from _stats import pct

from sandbox.config.state import StateUrl, parse_state_url
from sandbox.journal.approvals import Approval
from sandbox.state import QuotaLimits, Reservation, open_store
from sandbox.state.admin import migrate_store

N = 500
JOURNAL_N = 5000
REPLICA_CLIENTS, REPLICA_EACH = 16, 40
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


async def commits(path: Path, pg: StateUrl | None) -> tuple[list[float], float, float]:
    """A call's commit (append + barrier) p50 source, appends a second, and (with `pg`) the
    shipper's events a second into the shared table."""
    from sandbox.journal.store import Journal
    from sandbox.state.shipping import ship_journal

    journal = Journal(path)
    out: list[float] = []
    try:
        async with anyio.create_task_group() as tg:
            store = None
            if pg is not None:
                store = await tg.start(_open_store, pg, path.parent)
                tg.start_soon(ship_journal, journal, store)
            started = time.perf_counter()
            for i in range(JOURNAL_N):
                t = time.perf_counter()
                journal.append(
                    trace_id=f"t{i}", call_id=f"c{i}", session="agent:m:s", tenant="t", agent="m", tool="exec",
                    stage="running", data={"waited_s": 0.0},
                )  # fmt: skip
                await journal.commit(f"c{i}")
                out.append((time.perf_counter() - t) * 1000)
            rate = JOURNAL_N / (time.perf_counter() - started)
            shipped_rate = 0.0
            if store is not None:
                last = journal.last_event_id()
                origin = journal.journal_id()
                while await store.shipped_up_to(origin) < last:  # noqa: ASYNC110 - a row in the database
                    await anyio.sleep(0.01)
                shipped_rate = JOURNAL_N / (time.perf_counter() - started)
            tg.cancel_scope.cancel()
    finally:
        journal.close()
    return out, rate, shipped_rate


async def _open_store(url: StateUrl, state_dir: Path, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    await migrate_store(url, state_dir)
    async with open_store(url, state_dir, owner="ship@elsewhere|b|1|1") as store:
        task_status.started(store)
        await anyio.sleep_forever()


async def tracked(url: StateUrl, state_dir: Path) -> list[float]:
    """What the shared store adds to an unkeyed call: its record made before and removed after."""
    from sandbox.journal.calls import CallRecord

    out = []
    async with open_store(url, state_dir, owner="track@elsewhere|b|1|1") as store:
        for i in range(N + 20):
            record = CallRecord(
                f"u{i}", "t", "agent:m:s", "m", "exec", None, "", "running", None, "", time.time(), None
            )
            start = time.perf_counter()
            await store.track_call(record)  # type: ignore[attr-defined]
            await store.untrack_call(record.call_id)  # type: ignore[attr-defined]
            if i >= 20:
                out.append((time.perf_counter() - start) * 1000)
    return out


def replicas(pg: str, tmp: Path, count: int) -> float:
    """Calls a second through `count` replicas on the store at `pg` (host-mode `read`)."""
    import subprocess

    from service import TOKEN, config_text, start

    anyio.run(migrate_store, parse_state_url(pg), tmp)
    servers: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for n in range(count):
            folder = tmp / f"r{count}-{n}"
            (folder / "ws").mkdir(parents=True)
            (folder / "ws" / "note.txt").write_text("hello there\n")
            cfg = folder / "c.yaml"
            cfg.write_text(config_text(str(folder)) + f"state: {{url: '{pg}'}}\n")
            server, url = start(cfg)
            servers.append(server)
            urls.append(url)

        async def drive() -> float:
            import httpx

            limits = httpx.Limits(max_connections=REPLICA_CLIENTS)
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120, limits=limits) as c:

                async def one(url: str) -> None:
                    for _ in range(REPLICA_EACH):
                        r = await c.post(
                            f"{url}/v1/sessions/s/calls", json={"tool": "read", "args": {"path": "note.txt"}}
                        )
                        assert r.status_code == 200 and r.json()["ok"], r.text

                for url in urls:  # warm
                    await one(url)
                began = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for i in range(REPLICA_CLIENTS):
                        tg.start_soon(one, urls[i % len(urls)])
                return REPLICA_CLIENTS * REPLICA_EACH / (time.perf_counter() - began)

        return anyio.run(drive)
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=60)


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
            (Path(tmp) / "j1").mkdir()
            (Path(tmp) / "j2").mkdir()
            alone = anyio.run(commits, Path(tmp) / "j1" / "journal.sqlite3", None)
            shipped = anyio.run(commits, Path(tmp) / "j2" / "journal.sqlite3", pg)
            track = anyio.run(tracked, pg, Path(tmp) / "pg")
            one = replicas(create_database(server), Path(tmp), 1)
            two = replicas(create_database(server), Path(tmp), 2)
    finally:
        server.stop()
    print(f"{'store':<24}{'reserve+release p50':>21}{'p95':>8}{'2 replicas, /s':>16}{'wake p50':>10}{'p95':>8}")
    for kind, seq, rate, wakes in rows:
        print(
            f"{kind:<24}{pct(seq, 50):>18.2f} ms{pct(seq, 95):>8.2f}{rate:>16,.0f}"
            f"{pct(wakes, 50):>7.1f} ms{pct(wakes, 95):>8.1f}"
        )
    print()
    print(f"{'journal':<34}{'commit p50':>12}{'p95':>8}{'appends/s':>11}{'shipped/s':>11}")
    for name, (lat, rate, ship) in (("local only (sqlite)", alone), ("shipped to postgresql", shipped)):
        shown = f"{ship:>11,.0f}" if ship else f"{'-':>11}"
        print(f"{name:<34}{pct(lat, 50):>9.3f} ms{pct(lat, 95):>8.3f}{rate:>11,.0f}{shown}")
    print(f"{'ratio (shipped / local) p50':<34}{pct(shipped[0], 50) / pct(alone[0], 50):>11.2f}x")
    print(
        f"{'unkeyed call record (postgresql)':<34}{pct(track, 50):>9.3f} ms{pct(track, 95):>8.3f}  (made before, removed after)"
    )
    print()
    print(f"{'replicas on postgresql':<34}{'calls/s':>10}{'ratio':>8}")
    print(f"{'one replica':<34}{one:>10,.0f}{1.0:>7.2f}x")
    print(f"{'two replicas (clients split)':<34}{two:>10,.0f}{two / one:>7.2f}x")


if __name__ == "__main__":
    main()
