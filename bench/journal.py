"""Benchmark: what journaling costs per call (a no-op tool, with and without the journal).

Sequential calls (one session: the latency a call pays), then concurrent ones (many sessions:
throughput, and the longest the event loop stalled, seen by a ticker task that sleeps 1 ms).
Run: python bench/journal.py
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

from sandbox import Orchestrator, load_config_text
from sandbox.tools import BUILTIN_SPECS
from sandbox.tools.registry import ToolRegistry

N = 3000
SESSIONS, CALLS = 64, 40  # the concurrent part: SESSIONS sessions of CALLS calls each


def registry() -> ToolRegistry:
    reg = ToolRegistry((s, None) for s in BUILTIN_SPECS)

    @reg.tool(category="custom")
    async def noop(ctx: Any, n: int = 0) -> int:
        """Do nothing."""
        return n

    return reg


async def measure(journal: bool, tmp: str) -> tuple[list[float], int, float]:
    config = load_config_text(
        f"state_dir: {tmp}/state-{journal}\ntools: {{profile: full}}\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{tmp}/ws'}}]}}\n"
    )
    async with Orchestrator(config, registry=registry(), journal=journal) as orch:
        sess = orch.session("agent:a:main")
        for _ in range(200):
            await sess.call("noop", {"n": 1})
        out = []
        # CPU time of the event loop's own thread: what the loop spends, whoever waits for what
        cpu = time.thread_time()
        for _ in range(N):
            t = time.perf_counter()
            await sess.call("noop", {"n": 1})
            out.append((time.perf_counter() - t) * 1e6)
        loop_cpu_us = (time.thread_time() - cpu) / N * 1e6
        events = len(orch.journal.events(limit=10**9)) if orch.journal else 0
    return out, events, loop_cpu_us


async def concurrent(journal: bool, tmp: str) -> tuple[float, float]:
    """Calls per second over SESSIONS concurrent sessions, and the longest loop stall in ms."""
    config = load_config_text(
        f"state_dir: {tmp}/cstate-{journal}\ntools: {{profile: full}}\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{tmp}/ws'}}]}}\n"
        "limits: {global_concurrency: 1000, tenant_concurrency: 1000, queue: {max_depth: 10000}}\n"
    )
    stalls: list[float] = []
    async with Orchestrator(config, registry=registry(), journal=journal) as orch:

        async def session(i: int) -> None:
            sess = orch.session(f"agent:a:c{i}")
            for _ in range(CALLS):
                await sess.call("noop", {"n": 1})

        async def ticker(done: anyio.Event) -> None:
            while not done.is_set():
                t = time.perf_counter()
                await anyio.sleep(0.001)
                stalls.append((time.perf_counter() - t) * 1000 - 1)

        done = anyio.Event()
        start = time.perf_counter()
        async with anyio.create_task_group() as outer:
            outer.start_soon(ticker, done)
            async with anyio.create_task_group() as tg:
                for i in range(SESSIONS):
                    tg.start_soon(session, i)
            took = time.perf_counter() - start
            done.set()
    return SESSIONS * CALLS / took, max(stalls, default=0.0)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        without, _, cpu_without = await measure(False, tmp)
        with_journal, events, cpu_with = await measure(True, tmp)
        rate_without, stall_without = await concurrent(False, tmp)
        rate_with, stall_with = await concurrent(True, tmp)
    added = pct(with_journal, 50) - pct(without, 50)
    print(f"journal cost per call, no-op tool, n={N} (SQLite WAL, synchronous=NORMAL)\n")
    print(f"{'measure':<34} {'p50 us':>9} {'p99 us':>9} {'loop CPU us/call':>17}")
    print(f"{'without journal':<34} {pct(without, 50):9.1f} {pct(without, 99):9.1f} {cpu_without:17.1f}")
    print(f"{'with journal':<34} {pct(with_journal, 50):9.1f} {pct(with_journal, 99):9.1f} {cpu_with:17.1f}")
    print(
        f"\nadded by the journal at p50: {added:.1f} us (goal <= 300 us); ratio {pct(with_journal, 50) / pct(without, 50):.2f}x"
    )
    print(f"event-loop CPU added by the journal per call: {cpu_with - cpu_without:.1f} us (the rest is off the loop)")
    per_call = events / (N + 200)
    print(f"{events} events written, {per_call:.1f} per call; {events / (sum(with_journal) / 1e6):,.0f} events/s")
    print(f"\n{SESSIONS} sessions x {CALLS} calls, concurrent   {'calls/s':>9} {'max loop stall ms':>18}")
    print(f"{'without journal':<34} {rate_without:9,.0f} {stall_without:18.1f}")
    print(f"{'with journal':<34} {rate_with:9,.0f} {stall_with:18.1f}")
    print(f"journal throughput ratio (with / without): {rate_with / rate_without:.2f}")


if __name__ == "__main__":
    anyio.run(main)
