"""Timing helpers shared by the benchmarks: percentiles and a plain table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable


def pct(samples: list[float], q: float) -> float:
    """The q-th percentile (0..100) of samples."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def timed_async(fn: Callable[[], Awaitable[object]], n: int, warmup: int = 3) -> list[float]:
    """Run `fn` n times after a warm-up; return durations in ms."""
    for _ in range(warmup):
        await fn()
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def timed(fn: Callable[[], object], n: int, warmup: int = 3) -> list[float]:
    """Run `fn` n times after a warm-up; return durations in ms."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def table(title: str, rows: list[tuple[str, list[float], list[float] | None, str]]) -> str:
    """Rows of (operation, ours ms, baseline ms or None, goal); ratios are ours/baseline at p50."""
    lines = [title, "", f"{'operation':<44} {'p50 ms':>9} {'p90 ms':>9} {'base p50':>9} {'ratio':>7}  goal"]
    for name, ours, base, goal in rows:
        b50 = f"{pct(base, 50):9.3f}" if base else f"{'-':>9}"
        ratio = f"{pct(ours, 50) / pct(base, 50):7.2f}" if base else f"{'-':>7}"
        lines.append(f"{name:<44} {pct(ours, 50):9.3f} {pct(ours, 90):9.3f} {b50} {ratio}  {goal}")
    return "\n".join(lines)


def mean(samples: list[float]) -> float:
    """Arithmetic mean."""
    return statistics.fmean(samples)
