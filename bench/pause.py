"""Benchmark: the first call after a sandbox was paused for being idle, against a call on a
running one, and the raw engine's unpause.

In one run, interleaved (each sample: pause, time a call; then time a call on the running
sandbox): `exec true` through the whole pipeline on a paused sandbox (the call thaws it first)
and on a running one; the raw docker SDK's `unpause` then `exec_run("true")` against a plain
`exec_run("true")` on a container of the same image. Ratios are against the running sandbox's
call (ours) and against the raw `exec_run` (raw).
Run: python bench/pause.py   (needs the engine and `sandbox images build`)
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
from _stats import pct, table

from sandbox import Orchestrator, load_config_text

N = 40
IMAGE = "sandbox-exec:latest"


async def ours(tmp: str) -> tuple[list[float], list[float]]:
    config = load_config_text(
        f"state_dir: {tmp}/state\ninstance: bench-pause\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, idle_pause_s: 1}}, list: [{id: main}]}\n"
    )
    thawed, running = [], []
    async with Orchestrator(config) as orch:
        session = orch.session(agent="main", key="agent:main:bench-pause")
        assert (await session.call("exec", {"command": "true"})).ok
        name = orch.manager.spec_for(session.agent, session.key).name
        freezer = orch.backend.freezer()
        assert freezer is not None
        for i in range(N + 2):
            assert await freezer.pause(name)  # what the service's idle sweep does
            orch.manager.paused.add(name)
            start = time.perf_counter()
            assert (await session.call("exec", {"command": "true"})).ok
            after_pause = (time.perf_counter() - start) * 1000
            start = time.perf_counter()
            assert (await session.call("exec", {"command": "true"})).ok
            plain = (time.perf_counter() - start) * 1000
            if i >= 2:  # two warm-ups
                thawed.append(after_pause)
                running.append(plain)
        await session.close()
    return thawed, running


def raw() -> tuple[list[float], list[float]]:
    client = docker.from_env()
    box = client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, remove=True)
    thawed, running = [], []
    try:
        for i in range(N + 2):
            box.pause()
            start = time.perf_counter()
            box.unpause()
            box.exec_run(["true"])
            after_pause = (time.perf_counter() - start) * 1000
            start = time.perf_counter()
            box.exec_run(["true"])
            plain = (time.perf_counter() - start) * 1000
            if i >= 2:
                thawed.append(after_pause)
                running.append(plain)
    finally:
        box.remove(force=True)
        client.close()
    return thawed, running


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        thawed, running = anyio.run(ours, tmp)
    raw_thawed, raw_running = raw()
    rows = [
        ("exec true, first after a pause (ours)", thawed, running, "the thaw: a few ms"),
        ("exec true, on a running sandbox (ours)", running, raw_running, "(vs raw exec_run)"),
        ("raw unpause + exec_run", raw_thawed, raw_running, "(the engine's own cost)"),
        ("raw exec_run", raw_running, None, "(baseline)"),
    ]
    print(table(f"idle pause: the call that thaws a paused sandbox, n={N} each, interleaved", rows))
    print(f"\nthe thaw adds {pct(thawed, 50) - pct(running, 50):.1f} ms at p50 to a call (ours)")


if __name__ == "__main__":
    begin = time.perf_counter()
    main()
    print(f"\n(total {time.perf_counter() - begin:.1f} s)")
