"""Benchmark: the first call of a new session, with a warm pool and without one.

In one run, on the same image: `exec true` as a new session's first call through the whole
pipeline with `sandbox.pool.size` > 0 (the pool is refilled between samples, outside the timing:
this is the warm case) and with no pool (the container is made for the session: the honest cold
number); against a raw docker SDK `containers.run(image, "true", remove=True)` and an epicbox
throwaway run (when installed: `pip install epicbox`). Ratios are against the raw cold run.
Run: python bench/pool.py   (needs the engine and `sandbox images build`)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import docker
from _stats import pct, table, timed

from sandbox import Orchestrator, load_config_text

N = 40
IMAGE = "sandbox-exec:latest"


async def first_calls(tmp: str, pool: int) -> list[float]:
    config = load_config_text(
        f"state_dir: {tmp}/state-{pool}\ninstance: bench-pool-{pool}\n"
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: session, pool: {{size: {pool}}}}}}}}}\n"
    )
    samples = []
    async with Orchestrator(config) as orch:
        for i in range(N + 2):
            await orch.fill_pools()  # outside the timing: each sample finds the pool full
            start = time.perf_counter()
            result = await orch.session(f"agent:main:bench-{i}").call("exec", {"command": "true"})
            took = (time.perf_counter() - start) * 1000
            assert result.ok, result
            if i >= 2:  # two warm-ups
                samples.append(took)
        for info in await orch.manager.list():
            await orch.manager.remove(info)
    return samples


def epicbox_ms() -> list[float] | None:
    try:
        import epicbox
    except ImportError:
        return None
    _let_epicbox_use_urllib3_v2()
    epicbox.configure(profiles=[epicbox.Profile("bench", IMAGE, user="1000")])
    return timed(lambda: epicbox.run("bench", "true"), N)


def _let_epicbox_use_urllib3_v2() -> None:
    """epicbox 1.1 still passes urllib3 1.x's `method_whitelist` (renamed `allowed_methods`)."""
    from urllib3.util.retry import Retry

    original = Retry.__init__

    def init(self: Retry, *args: object, method_whitelist: object = None, **kwargs: object) -> None:
        if method_whitelist is not None:
            kwargs["allowed_methods"] = method_whitelist
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    Retry.__init__ = init  # type: ignore[method-assign]


def main() -> None:
    client = docker.from_env()
    raw = timed(lambda: client.containers.run(IMAGE, ["true"], remove=True), N)
    client.close()
    with tempfile.TemporaryDirectory() as tmp:
        warm = anyio.run(first_calls, tmp, 4)
        cold = anyio.run(first_calls, tmp, 0)
    peer = epicbox_ms()
    rows = [
        ("first call, warm pool vs raw containers.run", warm, raw, "<= 30 ms p50, >= 10x faster"),
        ("first call, no pool vs raw containers.run", cold, raw, "(the pool empty: honest)"),
    ]
    if peer is not None:
        rows.append(("epicbox run vs raw containers.run", peer, raw, "(peer)"))
    print(table(f"warm pool: a new session's first `exec true`, n={N} each, one run, same image", rows))
    print(f"\nraw cold run / warm first call at p50: {pct(raw, 50) / pct(warm, 50):.1f}x  (goal >= 10x)")
    if peer is not None:
        print(f"epicbox / warm first call at p50: {pct(peer, 50) / pct(warm, 50):.1f}x  (goal >= 10x)")


if __name__ == "__main__":
    begin = time.perf_counter()
    main()
    print(f"\n(total {time.perf_counter() - begin:.1f} s)")
