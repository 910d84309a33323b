"""Benchmark: what journaling costs per call (a no-op tool, with and without the journal).

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


def registry() -> ToolRegistry:
    reg = ToolRegistry((s, None) for s in BUILTIN_SPECS)

    @reg.tool(category="custom")
    async def noop(ctx: Any, n: int = 0) -> int:
        """Do nothing."""
        return n

    return reg


async def measure(journal: bool, tmp: str) -> list[float]:
    config = load_config_text(
        f"state_dir: {tmp}/state-{journal}\ntools: {{profile: full}}\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{tmp}/ws'}}]}}\n"
    )
    async with Orchestrator(config, registry=registry(), journal=journal) as orch:
        sess = orch.session("agent:a:main")
        for _ in range(200):
            await sess.call("noop", {"n": 1})
        out = []
        for _ in range(N):
            t = time.perf_counter()
            await sess.call("noop", {"n": 1})
            out.append((time.perf_counter() - t) * 1e6)
        events = len(orch.journal.events(limit=10**9)) if orch.journal else 0
    return out, events


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        without, _ = await measure(False, tmp)
        with_journal, events = await measure(True, tmp)
    added = pct(with_journal, 50) - pct(without, 50)
    print(f"journal cost per call, no-op tool, n={N} (SQLite WAL, synchronous=NORMAL)\n")
    print(f"{'measure':<34} {'p50 us':>9} {'p99 us':>9}")
    print(f"{'without journal':<34} {pct(without, 50):9.1f} {pct(without, 99):9.1f}")
    print(f"{'with journal':<34} {pct(with_journal, 50):9.1f} {pct(with_journal, 99):9.1f}")
    print(
        f"\nadded by the journal at p50: {added:.1f} us (goal <= 300 us); ratio {pct(with_journal, 50) / pct(without, 50):.2f}x"
    )
    per_call = events / (N + 200)
    print(f"{events} events written, {per_call:.1f} per call; {events / (sum(with_journal) / 1e6):,.0f} events/s")


if __name__ == "__main__":
    anyio.run(main)
