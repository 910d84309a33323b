"""Benchmark: a month of every replica's journal events in PostgreSQL (sbx_events), against a
day's worth in the same run.

The table is filled in SQL (generate_series) with the shape the shipper writes: 30 days of
events of 20 tenants, one of them holding 40% of the rows (a big platform tenant beside small
ones), 4 events a call, 10 calls a session. Then what `GET /v1/logs` asks, through the store's
own `events_page` (the code the API runs), 30 times each, on the month and on a table of one
day (the baseline: the same queries on a small table, so the ratio is what a month adds):

- the operator's newest page (no tenant), a big and a small tenant's newest page;
- the big tenant's 50th page (walking its cursors; only the last page is timed);
- one session, one trace, and a one-hour window twenty days back (big and small tenant);
- shipping: a batch of 500 events added (the shipper's insert, the size row kept exact);
- retention by age: one day of the month removed (rows a second), as `journal.retention` does.

PostgreSQL is a private server on loopback (tests/pg_server.py: fsync off, as in the tests).
Run: python bench/state_month.py [--events N]   (default 3,000,000: about 1.2 events a second
for 30 days; the fill takes a minute or two and about 2 GB of disk)
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import psycopg
from _stats import pct, timed_async

from sandbox.config.state import parse_state_url
from sandbox.journal.queries import Event
from sandbox.state import open_store
from sandbox.state.admin import migrate_store

DAY_S = 86_400.0
MONTH_DAYS = 30
REPEATS = 30
EVENTS_PER_CALL, CALLS_PER_SESSION = 4, 10
BIG = "t0"  # 40% of the rows
SMALL = "t7"

# one INSERT ... SELECT: event g of n, spread evenly over `span` seconds ending now
FILL = """
INSERT INTO sbx_events (origin, origin_id, ts, trace_id, call_id, session, tenant, agent, tool, stage,
                        duration_ms, data, bytes)
SELECT 'bench', g, %(start)s + g * %(step)s,
       'tr-' || (g / 4), 'c-' || (g / 4), 'agent:main:s' || (g / 40),
       CASE WHEN g %% 10 < 4 THEN 't0' ELSE 't' || (1 + (g / 40) %% 19) END,
       'main', CASE WHEN g %% 3 = 0 THEN 'exec' ELSE 'read' END,
       (ARRAY['queued', 'started', 'running', 'finished'])[1 + g %% 4],
       CASE WHEN g %% 4 = 3 THEN 12.5 END,
       '{"command": "pytest -q tests/unit", "exit_code": 0, "output": "' || repeat('x', 120) || '"}',
       360
FROM generate_series(1, %(n)s) AS g
"""


def fill(url: str, n: int, span_s: float) -> float:
    """Fill the table with `n` events over the last `span_s` seconds; the seconds it took."""
    started = time.perf_counter()
    now = time.time()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL, {"start": now - span_s, "step": span_s / n, "n": n})
        conn.execute("UPDATE sbx_events_size SET rows = (SELECT count(*) FROM sbx_events), bytes = "
                     "(SELECT coalesce(sum(bytes), 0) FROM sbx_events)")  # fmt: skip
        conn.execute("INSERT INTO sbx_event_origins VALUES ('bench', %s) ON CONFLICT DO NOTHING", (n,))
        conn.execute("VACUUM ANALYZE sbx_events")
    return time.perf_counter() - started


def table_mib(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_total_relation_size('sbx_events')").fetchone()
    return float(row[0]) / 2**20 if row else 0.0


def _events(start_id: int, count: int) -> list[Event]:
    now = time.time()
    return [
        Event(
            start_id + i,
            now,
            f"tr-new-{i // 4}",
            f"c-new-{i // 4}",
            f"agent:main:new{i // 40}",
            BIG,
            "main",
            "exec",
            "finished",
            3.0,
            {"command": "true", "exit_code": 0},
        )
        for i in range(count)
    ]


async def measure(url: str, n: int, span: float, state_dir: Path) -> dict[str, list[float]]:
    """Each query's durations (ms), and the shipping and pruning rates."""
    out: dict[str, list[float]] = {}
    rng = random.Random(7)
    async with open_store(parse_state_url(url), state_dir, owner="bench@elsewhere|b|1|1") as store:
        shared: Any = store

        def page(**kw: Any) -> Callable[[], Awaitable[object]]:
            return lambda: shared.events_page(limit=100, **kw)

        out["operator newest page"] = await timed_async(page(tenant=None), REPEATS)
        out["big tenant newest page"] = await timed_async(page(tenant=BIG), REPEATS)
        out["small tenant newest page"] = await timed_async(page(tenant=SMALL), REPEATS)
        cursor = None
        for _ in range(49):
            cursor = (await shared.events_page(tenant=BIG, cursor=cursor, limit=100)).next_cursor
        out["big tenant 50th page"] = await timed_async(page(tenant=BIG, cursor=cursor), REPEATS)

        def session_of() -> Callable[[], Awaitable[object]]:
            g = rng.randrange(0, n // 10) * 10  # an event of the big tenant
            return page(tenant=BIG, session=f"agent:main:s{g // 40}")

        sessions = [session_of() for _ in range(REPEATS + 3)]
        out["one session"] = await timed_async(lambda: sessions.pop()(), REPEATS)
        traces = [rng.randrange(0, n // 10) * 10 // 4 for _ in range(REPEATS + 3)]
        out["one trace"] = await timed_async(lambda: shared.events_page(tenant=BIG, trace_id=f"tr-{traces.pop()}"),
                                             REPEATS)  # fmt: skip
        since = time.time() - span * 2 / 3
        out["big tenant, 1 h window"] = await timed_async(page(tenant=BIG, since=since, until=since + 3600), REPEATS)
        out["small tenant, 1 h window"] = await timed_async(
            page(tenant=SMALL, since=since, until=since + 3600), REPEATS
        )
        next_id = [n + 1]

        async def ship() -> None:
            await shared.add_events("bench-ship", _events(next_id[0], 500))
            next_id[0] += 500

        out["ship 500 events"] = await timed_async(ship, REPEATS)
        started = time.perf_counter()
        pruned = await shared.prune_events(max_age_s=span * (1 - 1 / MONTH_DAYS), max_bytes=None)
        out["prune 1/30 by age"] = [(time.perf_counter() - started) * 1000, float(pruned.deleted)]
    return out


def main() -> None:
    from tests.pg_server import create_database, start_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3_000_000)
    args = parser.parse_args()
    day_n = max(1000, args.events // MONTH_DAYS)
    server = start_server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            day_url, month_url = create_database(server), create_database(server)
            for url in (day_url, month_url):
                anyio.run(migrate_store, parse_state_url(url), Path(tmp))
            fill(day_url, day_n, DAY_S)
            fill_s = fill(month_url, args.events, MONTH_DAYS * DAY_S)
            sizes = table_mib(day_url), table_mib(month_url)
            day = anyio.run(measure, day_url, day_n, DAY_S, Path(tmp))
            month = anyio.run(measure, month_url, args.events, MONTH_DAYS * DAY_S, Path(tmp))
    finally:
        server.stop()
    print(f"sbx_events: a day = {day_n:,} events ({sizes[0]:,.0f} MiB); a month = {args.events:,} events "
          f"({sizes[1]:,.0f} MiB, filled in {fill_s:.0f} s)")  # fmt: skip
    print()
    print(f"{'query (limit 100)':<28}{'day p50':>10}{'p95':>8}{'month p50':>12}{'p95':>8}{'ratio p50':>11}")
    for name in month:
        if name.startswith("prune"):
            continue
        d, m = day[name], month[name]
        print(f"{name:<28}{pct(d, 50):>7.2f} ms{pct(d, 95):>8.2f}{pct(m, 50):>9.2f} ms{pct(m, 95):>8.2f}"
              f"{pct(m, 50) / pct(d, 50):>10.2f}x")  # fmt: skip
    for label, got in (("day", day), ("month", month)):
        ms, rows = got["prune 1/30 by age"]
        rate = rows / (ms / 1000) if ms else 0.0
        print(f"prune 1/30 by age ({label}): {rows:,.0f} rows in {ms / 1000:.2f} s ({rate:,.0f} rows/s)")
    ship = pct(month["ship 500 events"], 50)
    print(f"shipping on the month's table: 500 events in {ship:.1f} ms p50 ({500 / ship * 1000:,.0f} events/s)")


if __name__ == "__main__":
    main()
