"""Benchmark: the engine's own cost per call (policy, validation, limits, context, shaping).

A no-op Python tool in a host-mode session, against calling the same handler directly.
Run: python bench/engine.py
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

N = 5000


async def main() -> None:
    registry = ToolRegistry((s, None) for s in BUILTIN_SPECS)

    @registry.tool(category="custom")
    async def noop(ctx: Any, n: int = 0) -> int:
        """Do nothing."""
        return n

    handler = registry.handler("noop")
    assert handler is not None
    args = registry.get("noop").parameters.model_validate({"n": 1})
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config_text(
            f"state_dir: {tmp}/state\ntools: {{profile: full}}\n"
            f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{tmp}/ws'}}]}}\n"
            "limits: {global_concurrency: 100, tenant_concurrency: 100, queue: {max_depth: 1000}}\n"
        )
        async with Orchestrator(config, registry=registry, journal=False) as orch:  # journal: bench/journal.py
            sess = orch.session("agent:a:main")
            for _ in range(200):
                await sess.call("noop", {"n": 1})
            engine_us, direct_us = [], []
            for _ in range(N):
                t = time.perf_counter()
                await sess.call("noop", {"n": 1})
                engine_us.append((time.perf_counter() - t) * 1e6)
                t = time.perf_counter()
                await handler(None, args)
                direct_us.append((time.perf_counter() - t) * 1e6)
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(100):
                    tg.start_soon(sess.call, "noop", {"n": 1})
            burst_s = time.perf_counter() - start
    overhead = [e - d for e, d in zip(engine_us, direct_us, strict=True)]
    print(f"engine overhead per call, no-op handler, n={N}\n")
    print(f"{'measure':<42} {'p50':>9} {'p99':>9}  goal")
    print(f"{'through the engine, us':<42} {pct(engine_us, 50):9.1f} {pct(engine_us, 99):9.1f}")
    print(f"{'handler called directly (baseline), us':<42} {pct(direct_us, 50):9.1f} {pct(direct_us, 99):9.1f}")
    print(f"{'engine overhead, us':<42} {pct(overhead, 50):9.1f} {pct(overhead, 99):9.1f}  <= 150 us p50")
    print(f"\n100 concurrent no-op calls: {burst_s * 1000:.1f} ms ({100 / burst_s:,.0f} calls/s)")


if __name__ == "__main__":
    anyio.run(main)
