"""Benchmark: `exec true` through the resident agent against Docker's exec round trip.

In one run, on the same image: the `exec` tool through the whole pipeline (policy, journal,
sandbox) with the resident agent and with `docker.agent: off`; a raw docker SDK `exec_run` on
a plain container; llm-sandbox's `execute_command` (when installed: `pip install llm-sandbox`);
and the agent's bare round trip (a ping). Ratios are against raw `exec_run`.
Run: python bench/agent.py   (needs the engine and `sandbox images build`)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import docker
from _stats import pct, table, timed, timed_async

from sandbox import Orchestrator, load_config_text

N = 300
IMAGE = "sandbox-exec:latest"


async def tool_exec_ms(tmp: Path, agent: str, runtime: str = "runc") -> tuple[list[float], list[float]]:
    """(exec `true` through the tool, the agent's ping) in ms; ping is [] without the agent."""
    ws = tmp / f"ws-{agent}-{runtime}"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    config = load_config_text(
        f"state_dir: {tmp}/state-{agent}-{runtime}\ninstance: ba-{agent}-{runtime}\n"
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: agent, docker: {{agent: '{agent}', runtime: {runtime}}}}}}}, "
        f"list: [{{id: a, workspace: '{ws}'}}]}}\n"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:bench")

        async def call() -> None:
            result = await sess.call("exec", {"command": "true"})
            assert result.ok, result

        samples = await timed_async(call, N)
        pings: list[float] = []
        box: Any = await sess.sandbox()
        link = await box.backend.agents.link(box.id, box.spec, None)
        if link is not None:
            pings = [await link.ping() for _ in range(N)]
        for info in await orch.manager.list():
            await orch.manager.remove(info)
    return samples, pings


def llm_sandbox_ms() -> list[float] | None:
    try:
        from llm_sandbox import SandboxSession
    except ImportError:
        return None
    session = SandboxSession(lang="python", image=IMAGE, keep_template=True, verbose=False, workdir="/tmp/llm")
    session.open()
    try:
        return timed(lambda: session.execute_command("true"), N)
    finally:
        session.close()


async def main() -> None:
    client = docker.from_env()
    gvisor = "runsc" in (client.info().get("Runtimes") or {})
    plain = client.containers.run(IMAGE, detach=True, labels={"io.agent-sandbox.bench": "1"})
    plain_runsc = (
        client.containers.run(IMAGE, detach=True, runtime="runsc", labels={"io.agent-sandbox.bench": "1"})
        if gvisor
        else None
    )
    try:
        raw = timed(lambda: plain.exec_run(["true"]), N)
        with tempfile.TemporaryDirectory() as tmp:
            agent_ms, ping_ms = await tool_exec_ms(Path(tmp), "auto")
            exec_ms, _ = await tool_exec_ms(Path(tmp), "off")
            if plain_runsc is not None:
                raw_runsc = timed(lambda: plain_runsc.exec_run(["true"]), N)
                agent_runsc, _ = await tool_exec_ms(Path(tmp), "auto", "runsc")
        peer = llm_sandbox_ms()
    finally:
        plain.remove(force=True)
        if plain_runsc is not None:
            plain_runsc.remove(force=True)
        client.close()
    rows = [
        ("exec `true`: tool via agent vs exec_run", agent_ms, raw, "<= 0.15x"),
        ("exec `true`: tool via docker exec vs exec_run", exec_ms, raw, "(the old path)"),
        ("agent round trip (ping) vs exec_run", ping_ms, raw, "-"),
    ]
    if peer is not None:
        rows.append(("llm-sandbox execute_command vs exec_run", peer, raw, "(peer)"))
    if gvisor:
        rows += [
            ("runsc: raw exec_run vs runc exec_run", raw_runsc, raw, "(gVisor's cost)"),
            ("runsc: tool via agent vs runsc exec_run", agent_runsc, raw_runsc, "(reported)"),
        ]
    print(table(f"resident agent: n={N} each, one run, same image (runc unless said)", rows))
    if not gvisor:
        print("\n(no runsc runtime on this engine: scripts/runsc adds the gVisor rows)")
    if peer is not None:
        print(f"\ntool via agent / llm-sandbox at p50: {pct(agent_ms, 50) / pct(peer, 50):.3f}  (goal <= 0.15)")
    else:
        print("\n(llm-sandbox not installed: `pip install llm-sandbox` adds it to the table)")


if __name__ == "__main__":
    start = time.perf_counter()
    anyio.run(main)
    print(f"\n(total {time.perf_counter() - start:.1f} s)")
