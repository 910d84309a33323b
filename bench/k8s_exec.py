"""Benchmark: the resident agent's round trip over a `pods/exec` websocket, beside the Docker path.

No cluster runs here, so the websocket is the stand-in API server of the tests
(tests/k8s_exec_server.py), bridged to the agent: once to a local agent process (the transport
alone), once to the agent in a real container by `docker exec -i` (what the fake cluster does).
In the same run, interleaved: the agent's ping over Docker's attached exec socket (today's
path), and raw docker SDK `exec_run` (the baseline). Ratios are against raw `exec_run`.
A real cluster adds the API server and the kubelet between the two ends; the targets for that
are in README (Kubernetes).
Run: python bench/k8s_exec.py   (needs the engine and `sandbox images build`)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
import anyio
import docker
from _stats import table, timed, timed_async

from sandbox import Orchestrator, load_config_text
from sandbox.runtime.agent.link import AgentLink
from sandbox.runtime.kubernetes.agents import PodExecStarter
from tests.k8s_exec_server import ExecServer

N = 300
IMAGE = "sandbox-exec:latest"
AGENT = str(Path(__file__).resolve().parent.parent / "images/sandbox/sandbox_agent.py")
AGENT_IN_IMAGE = "/usr/local/lib/sandbox-agent/agent.py"


async def main() -> None:
    client = docker.from_env()
    plain = client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, network_mode="none", user="1000:1000")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = load_config_text(
                f"state_dir: {tmp}/state\ninstance: bk8s\n"
                f"agents: {{defaults: {{sandbox: {{mode: all, scope: session}}}}, list: [{{id: a, workspace: '{tmp}/ws'}}]}}\n"
            )
            Path(tmp, "ws").mkdir()  # noqa: ASYNC240 - before anything runs
            async with Orchestrator(config) as orch, aiohttp.ClientSession() as http:
                session = orch.session("agent:a:bench")
                await session.call("exec", {"command": "true"})
                box = await session.sandbox_required()
                docker_link = await box.agent_link()
                auth = {"Authorization": "Bearer good-token"}
                async with ExecServer() as local_server:
                    local = await AgentLink.open(
                        PodExecStarter(http, local_server.url, "ns", headers=auth), "p", AGENT, None
                    )

                    def in_container(pod: str, argv: list[str]) -> list[str]:
                        return ["docker", "exec", "-i", plain.id, *argv]

                    async with ExecServer(command_for=in_container) as box_server:
                        starter = PodExecStarter(http, box_server.url, "ns", headers=auth)
                        boxed = await AgentLink.open(starter, "p", AGENT_IN_IMAGE, None)
                        rows: dict[str, list[float]] = {"raw": [], "docker": [], "ws-local": [], "ws-box": []}
                        for _ in range(N):  # interleaved: each sample of each path under the same load
                            rows["raw"] += timed(lambda: plain.exec_run(["true"]), 1, warmup=0)
                            rows["docker"] += await timed_async(docker_link.ping, 1, warmup=0)
                            rows["ws-local"] += await timed_async(local.ping, 1, warmup=0)
                            rows["ws-box"] += await timed_async(boxed.ping, 1, warmup=0)
                        run_ws = await timed_async(lambda: boxed.run(["true"]), N // 3)
                        run_docker = await timed_async(lambda: docker_link.run(["true"]), N // 3)
                        local.close()
                        boxed.close()
                await session.close()
    finally:
        plain.remove(force=True)
    raw = rows["raw"]
    print(
        table(
            f"agent round trips, {N} interleaved samples each (ratio: against raw exec_run)",
            [
                ("raw docker SDK exec_run `true` (baseline)", raw, raw, ""),
                ("agent ping over Docker's attached exec", rows["docker"], raw, "today's path"),
                ("agent ping over pods/exec websocket, local", rows["ws-local"], raw, "transport alone"),
                ("agent ping over pods/exec websocket, box", rows["ws-box"], raw, "fake cluster's path"),
                ("agent run `true` over Docker's exec", run_docker, raw, ""),
                ("agent run `true` over the websocket, box", run_ws, raw, ""),
            ],
        )
    )


if __name__ == "__main__":
    anyio.run(main)
