"""Benchmark: memory over 10,000 sessions opened and closed in one orchestrator (a service's weeks).

Each session is host mode (`mode: off`) with the journal on: opened, one no-op call, closed.
Prints RSS (VmRSS) and the size of every per-session map at 0, 1k, 5k and 10k sessions; flat
means the caches are bounded and closing a session lets its state go.
Run: python bench/sessions.py [sessions]
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio

from sandbox import Orchestrator, load_config_text
from sandbox.tools import BUILTIN_SPECS
from sandbox.tools.registry import ToolRegistry

SESSIONS = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
MARKS = (0, 1_000, 5_000, 10_000)


def rss_mb() -> float:
    """Resident set size now (VmRSS), in MB; ru_maxrss would only ever grow."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    import resource  # not Linux: the peak is the best there is

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cache_sizes(orch: Orchestrator) -> dict[str, int]:
    """Every map that could grow with sessions, by name (absent ones count 0)."""

    def size(obj: Any, attr: str) -> int:
        return len(getattr(obj, attr, None) or ())

    store = orch.loops.store
    sizes = {
        "policy": size(orch.policy, "_cache"),
        "loops.mem": size(store, "calls") + size(store, "tripped"),
    }
    manager = orch._manager
    for attr in ("_entries", "_specs", "_locks", "_names", "_last_used_written"):
        sizes[f"mgr{attr}"] = size(manager, attr) if manager is not None else 0
    journal = orch.journal
    sizes["jnl.pending"] = size(journal, "_pending")
    writer = getattr(journal, "_writer", None)
    sizes["jnl.queue"] = writer.backlog() if writer is not None else 0
    return sizes


def registry() -> ToolRegistry:
    reg = ToolRegistry((s, None) for s in BUILTIN_SPECS)

    @reg.tool(category="custom")
    async def noop(ctx: Any, n: int = 0) -> int:
        """Do nothing."""
        return n

    return reg


async def main() -> None:
    rows: list[tuple[int, float, float, dict[str, int]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config_text(
            f"state_dir: {tmp}/state\ntools: {{profile: full}}\n"
            f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{tmp}/ws'}}]}}\n"
        )
        async with Orchestrator(config, registry=registry()) as orch:
            started = time.perf_counter()
            for i in range(SESSIONS + 1):
                if i in MARKS:
                    gc.collect()
                    rows.append((i, time.perf_counter() - started, rss_mb(), cache_sizes(orch)))
                if i == SESSIONS:
                    break
                session = orch.session(f"agent:a:s{i}")
                result = await session.call("noop", {"n": i})
                assert result.ok, result.error
                await session.close()
            events = len(orch.journal.events(limit=10**9)) if orch.journal else 0
    names = list(rows[0][3])
    print(f"memory over {SESSIONS:,} sessions (host mode, journal on, one no-op call each, then close)\n")
    print(f"{'sessions':>8} {'time s':>7} {'RSS MB':>8} {'+MB':>6}  " + " ".join(f"{n:>12}" for n in names))
    base = rows[0][2]
    for count, took, rss, sizes in rows:
        print(f"{count:>8,} {took:7.1f} {rss:8.1f} {rss - base:6.1f}  " + " ".join(f"{sizes[n]:>12,}" for n in names))
    last = [r for r in rows if r[0] >= 1_000]
    if len(last) >= 2:
        per_k = (last[-1][2] - last[0][2]) / ((last[-1][0] - last[0][0]) / 1000)
        print(f"\ngrowth after the first 1,000 sessions: {per_k:.2f} MB per 1,000 sessions (goal: ~0, flat)")
    print(f"{events:,} journal events written")


if __name__ == "__main__":
    anyio.run(main)
