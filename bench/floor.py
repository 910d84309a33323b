"""Benchmark: where the time of one `exec true` goes, stage by stage, interleaved with raw docker.

Every round runs each measurement once (the order rotated from round to round), so the engine
is as busy for each stage as for the baseline (a raw `exec_run` on a plain container of the same image):

  engine        raw `exec_run(["true"])` (the baseline every ratio is against)
  frame         the resident agent's bare round trip (a ping over its link: the FIFOs beside the
                engine where the sandbox has a link folder, else the engine's exec stream)
  stream        the same ping to a second agent of the same sandbox over the exec stream (what
                the frame costs without the FIFO link)
  spawn         the agent running `/bin/true`, less the ping: fork, exec and reap in the sandbox
  shell         the agent running the command as exec runs it (the kill-group shell wrapper)
  journal       one call's stages queued and awaited durable (the barrier before a handler)
  quota         the workspace measurement taken before a command starts
  tool          exec `true` through the whole pipeline (policy, journal, limits, agent)
  tool_s        the same in a second orchestrator whose agents keep the exec stream (no FIFO link)
  pipeline      tool less shell: what the orchestrator adds around the agent's run

The last lines name the floor: what one call cannot go under on this machine (frame + spawn).
Run: python bench/floor.py [rounds]   (needs the engine and `sandbox images build`)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import docker
from _stats import pct

from sandbox import Orchestrator, load_config_text
from sandbox.runtime import shellwrap
from sandbox.runtime.agent.link import AgentLink

IMAGE = "sandbox-exec:latest"


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000


async def main(rounds: int) -> None:
    client = docker.from_env()
    plain = client.containers.run(IMAGE, detach=True, labels={"io.agent-sandbox.bench": "1"})
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        os.chown(ws, 1000, 1000)

        def config(name: str) -> Any:
            return load_config_text(
                f"state_dir: {tmp}/{name}\ninstance: {name}\n"
                "agents: {defaults: {sandbox: {mode: all, scope: agent, workspace_access: rw}}, "
                f"list: [{{id: a, workspace: '{ws}'}}]}}\n"
            )

        try:
            async with Orchestrator(config("bench-floor")) as orch, Orchestrator(config("bench-floor-s")) as plain_orch:
                # the same sandbox config, its agents kept on the engine's exec stream
                plain_orch.manager.backend.links.refuse("bench: the exec stream, for comparison")
                samples = await measure(orch, plain_orch, plain, rounds)
                for one in (orch, plain_orch):
                    for info in await one.manager.list():
                        await one.manager.remove(info)
        finally:
            plain.remove(force=True)
            client.close()
    report(samples, rounds)


async def measure(orch: Any, stream_orch: Any, plain: Any, rounds: int) -> dict[str, list[float]]:
    sess = orch.session("agent:a:bench")
    assert (await sess.call("exec", {"command": "true"})).ok
    stream_sess = stream_orch.session("agent:a:bench")
    assert (await stream_sess.call("exec", {"command": "true"})).ok
    box = await sess.sandbox()
    link = await box.backend.agents.link(box.id, box.spec, None)
    path = await box.backend.agents.exec_path(box.spec, box.id)
    stream_link = await AgentLink.open(box.backend.agents._starter, box.id, path.agent_path, None, link=False)
    print(
        f"the agent's link: {type(link.transport).__name__}; the second agent's: {type(stream_link.transport).__name__}"
    )
    quota = sess._files.quota  # the session's workspace quota, as exec measures it
    wrapped = shellwrap.wrapped_argv("true", "c_bench", shellwrap.PID_DIR)
    journal = orch.journal

    async def engine() -> None:
        await anyio.to_thread.run_sync(plain.exec_run, ["true"])

    async def journal_barrier() -> None:
        for stage in ("proposed", "policy_checked", "validated", "queued", "running"):
            journal.append(
                trace_id="t_bench",
                call_id="c_bench",
                session="s",
                tenant="default",
                agent="a",
                tool="exec",
                stage=stage,
                data={},
                commit=stage == "running",
            )
        await journal.commit("c_bench")

    async def quota_measure() -> None:
        if quota is not None and quota.enabled and quota.measure_small() is None:
            await anyio.to_thread.run_sync(quota.measure)

    async def tool() -> None:
        assert (await sess.call("exec", {"command": "true"})).ok

    async def tool_over_stream() -> None:
        assert (await stream_sess.call("exec", {"command": "true"})).ok

    steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("engine", engine),
        ("frame", link.ping),
        ("stream", stream_link.ping),
        ("run", lambda: link.run(["/bin/true"])),
        ("shell", lambda: link.run(wrapped, environment={"SBX_CALL": "c_bench"})),
        ("journal", journal_barrier),
        ("quota", quota_measure),
        ("tool", tool),
        ("tool_stream", tool_over_stream),
    ]
    samples: dict[str, list[float]] = {name: [] for name, _ in steps}
    for _ in range(5):  # warm-up
        for _, step in steps:
            await step()
    for index in range(rounds):
        # rotated each round: no stage always runs right after the engine's exec (whose
        # clean-up still holds the CPU then)
        turn = index % len(steps)
        for name, step in steps[turn:] + steps[:turn]:
            start = time.perf_counter()
            await step()
            samples[name].append(ms_since(start))
    stream_link.close()
    return samples


def report(samples: dict[str, list[float]], rounds: int) -> None:
    p50 = {name: pct(values, 50) for name, values in samples.items()}
    engine = p50["engine"]
    rows = [
        ("engine", "raw exec_run on a plain container (baseline)", p50["engine"]),
        ("frame", "agent round trip (ping) over its link", p50["frame"]),
        ("stream", "the same over the engine's exec stream", p50["stream"]),
        ("spawn", "fork + exec + reap of /bin/true in the sandbox", max(0.0, p50["run"] - p50["frame"])),
        ("shell", "agent runs the wrapped command (frame + spawn + wrapper)", p50["shell"]),
        ("journal", "a call's stages made durable (one barrier)", p50["journal"]),
        ("quota", "workspace measured before the command starts", p50["quota"]),
        ("tool", "exec `true` through the whole pipeline", p50["tool"]),
        ("tool_s", "the same, its agent on the exec stream", p50["tool_stream"]),
        ("pipeline", "tool less shell: the orchestrator around the run", max(0.0, p50["tool"] - p50["shell"])),
    ]
    load = os.getloadavg()[0]
    print(f"where exec `true` spends its time: {rounds} interleaved rounds, p50 ms (load {load:.2f})\n")
    print(f"{'stage':<9} {'p50 ms':>8} {'x engine':>9}  what")
    for name, what, value in rows:
        print(f"{name:<9} {value:8.3f} {value / engine:9.3f}  {what}")
    floor = p50["run"]
    print(
        f"\nfloor: frame + spawn = {floor:.3f} ms ({floor / engine:.3f}x engine); the tool is "
        f"{p50['tool'] / floor:.2f}x its floor; goal 0.05x engine = {0.05 * engine:.3f} ms"
    )


if __name__ == "__main__":
    started = time.perf_counter()
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 200)
    print(f"\n(total {time.perf_counter() - started:.1f} s)")
