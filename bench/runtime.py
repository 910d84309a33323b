"""Benchmark: cold sandbox and warm reuse against raw docker SDK calls of the same image.

Run: python bench/runtime.py   (needs the engine and `sandbox images build`)
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
from _stats import table, timed, timed_async

from sandbox.config import effective_agent, load_config_text
from sandbox.runtime.docker.backend import DockerBackend
from sandbox.runtime.manager import SandboxManager

COLD, WARM = 12, 500
IMAGE = "sandbox-exec:latest"


async def main() -> None:
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config_text(
            f"state_dir: {tmp}/state\ninstance: bench\nagents: {{defaults: {{sandbox: {{mode: all, scope: session}}}}}}\n"
        )
        agent = effective_agent(config, "main")
        backend = DockerBackend()
        manager = SandboxManager(config, backend)
        counter = iter(range(10_000))

        async def cold() -> None:
            await manager.sandbox_for(agent, f"agent:main:cold-{next(counter)}")

        cold_ms = await timed_async(cold, COLD, warmup=1)
        raw_ids: list[str] = []

        def raw_run() -> None:
            c = client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, labels={"io.agent-sandbox.bench": "1"})
            raw_ids.append(c.id)

        raw_cold = timed(raw_run, COLD, warmup=1)
        await manager.sandbox_for(agent, "agent:main:warm")

        async def warm() -> None:
            await manager.sandbox_for(agent, "agent:main:warm")

        warm_ms = await timed_async(warm, WARM)
        raw_get = timed(lambda: client.containers.get(raw_ids[0]), WARM)
        print(
            table(
                f"runtime: cold = first call of a new session (create + start + ready), n={COLD}; warm n={WARM}",
                [
                    ("cold sandbox vs raw containers.run(detach)", cold_ms, raw_cold, "<= 1.2x raw"),
                    ("warm reuse vs raw containers.get", warm_ms, raw_get, "<= 2 ms p50"),
                ],
            )
        )
        for info in await manager.list():
            await backend.remove(info.id)
        await backend.aclose()
    for cid in raw_ids:
        client.api.remove_container(cid, force=True)
    client.close()


if __name__ == "__main__":
    start = time.perf_counter()
    anyio.run(main)
    print(f"\n(total {time.perf_counter() - start:.1f} s)")
