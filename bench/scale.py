"""Benchmark: many idle sandboxes on one host.

Run: python bench/scale.py [count] [parallelism] [idle_s] [health_interval_s] [shim]   (defaults
200, 8, 150, 0 and tenant; needs the engine and `sandbox images build`; removes everything it made)

Creates `count` session-scoped sandboxes through the orchestrator with `parallelism` creations
in flight, then the same number of raw `containers.run` of the same image with the same
parallelism (the baseline, same run, with the same health checking as ours: none at 0).
Reports the wall time of each, the memory one idle sandbox costs the host (MemAvailable before
and after, divided by the count: container, shim, its tini and sleep), what its resident agent
adds once started (one command in each), the host's load average once they have all sat idle for `idle_s` (with `docker.health_interval_s`
as given: 0, the default, runs no Docker health check; 60 was the image's old every-minute
exec) and the host's CPU busy share over that time, and the time of `sandbox list` and
`prune --dry-run` with all of them present: in this process (lifecycle.rows, lifecycle.prune) and
as the CLI commands (their own process: start, imports, config, the listing; best of 3).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import anyio.to_thread
import docker

from sandbox.config import effective_agent, load_config_text
from sandbox.runtime import lifecycle
from sandbox.runtime.docker.backend import DockerBackend
from sandbox.runtime.manager import SandboxManager
from sandbox.runtime.protocol import RunRequest

COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 200
PARALLEL = int(sys.argv[2]) if len(sys.argv) > 2 else 8
IDLE_S = float(sys.argv[3]) if len(sys.argv) > 3 else 150.0
HEALTH_S = int(sys.argv[4]) if len(sys.argv) > 4 else 0
SHIM = sys.argv[5] if len(sys.argv) > 5 else "tenant"  # docker.shim: tenant (the default) or container
IMAGE = "sandbox-exec:latest"
LABEL = "io.agent-sandbox.bench-scale"
PARTS = ("agents", "shims", "storage", "engine", "orchestrator")


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _anon_mib(pid: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) / 1024
    except OSError:  # gone meanwhile
        pass
    return 0.0


def anon_by_part() -> dict[str, float]:
    """Anonymous memory (MiB) of the processes that make up the cost, by part: the resident
    agents, the shims, the engine (dockerd, containerd), the storage driver's own processes
    (fuse-overlayfs runs one per container; overlay2 none) and this orchestrator process; what
    MemAvailable loses beyond them is the kernel's (page tables, stacks, cgroups, pipes) and the
    sandboxes' own keep-alive (tini, sleep)."""
    parts = dict.fromkeys(PARTS, 0.0)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = args[0].rsplit(b"/", 1)[-1]
        if proc.name == str(os.getpid()):
            part = "orchestrator"
        elif any(b"/sandbox-agent/agent" in a for a in args):
            part = "agents"
        elif name.startswith(b"containerd-shim"):
            part = "shims"
        elif name in (b"dockerd", b"containerd"):
            part = "engine"
        elif name == b"fuse-overlayfs":
            part = "storage"
        else:
            continue
        parts[part] += _anon_mib(proc.name)
    return parts


def shim_count() -> int:
    """How many containerd shim processes run on the host."""
    count = 0
    for proc in Path("/proc").iterdir():
        try:
            name = (proc / "cmdline").read_bytes().split(b"\0")[0].rsplit(b"/", 1)[-1]
        except OSError:  # not a process, or gone meanwhile
            continue
        count += name.startswith(b"containerd-shim")
    return count


def settle() -> float:
    time.sleep(3)  # let the page cache and the engine settle before reading memory
    return mem_available_mib()


def cpu_ticks() -> tuple[int, int]:
    """The host's CPU time so far (all, idle) in ticks, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


def cli_seconds(config_file: Path, *argv: str) -> float:
    """The best of 3 wall times of a `sandbox` CLI command in its own process, after one run that
    fills a bytecode cache, as an installed package has one (pip compiles at install). Without
    it, where PYTHONDONTWRITEBYTECODE is set (this project's machines), an editable checkout
    compiles every module again at each start: about 0.12 s more here."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(sys.prefix) / "pycache")  # scripts/test's, in .venv
    command = [sys.executable, "-m", "sandbox", "--config", str(config_file), *argv]
    subprocess.run(command, check=True, capture_output=True, env=env)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=env)
        best = min(best, time.perf_counter() - start)
    return best


def load_average() -> float:
    """The host's 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


async def in_parallel(jobs: list, parallel: int) -> float:
    """Run async jobs with at most `parallel` in flight; the wall time in seconds."""
    limiter = anyio.Semaphore(parallel)
    start = time.perf_counter()

    async def one(job) -> None:  # type: ignore[no-untyped-def]
        async with limiter:
            await job()

    async with anyio.create_task_group() as group:
        for job in jobs:
            group.start_soon(one, job)
    return time.perf_counter() - start


async def main() -> None:
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        text = (
            f"state_dir: {tmp}/state\ninstance: scale\n"
            f"agents: {{defaults: {{sandbox: {{mode: all, scope: session, docker: {{health_interval_s: {HEALTH_S}, shim: {SHIM}}}}}}}}}\n"
        )
        config = load_config_text(text)
        config_file = Path(tmp) / "scale.yaml"  # the same config, for the CLI commands
        config_file.write_text(text)
        agent = effective_agent(config, "main")
        backend = DockerBackend(max_threads=max(32, PARALLEL * 2))
        manager = SandboxManager(config, backend)
        await manager.sandbox_for(agent, "agent:main:warmup")  # image checks, thread pool
        before = settle()
        parts_before = anon_by_part()
        shims_before = shim_count()

        def make(i: int):  # type: ignore[no-untyped-def]
            async def job() -> None:
                await manager.sandbox_for(agent, f"agent:main:scale-{i}")

            return job

        ours_s = await in_parallel([make(i) for i in range(COUNT)], PARALLEL)
        after = settle()
        parts_after = anon_by_part()
        shims = shim_count() - shims_before
        per_sandbox_mib = (before - after) / COUNT

        def first_command(i: int):  # type: ignore[no-untyped-def]
            async def job() -> None:
                box = await manager.sandbox_for(agent, f"agent:main:scale-{i}")
                await box.run(RunRequest("true", call_id=f"scale-{i}", timeout_s=60))

            return job

        # each sandbox's resident agent starts with its first command
        agents_s = await in_parallel([first_command(i) for i in range(COUNT)], PARALLEL)
        after_agents = settle()
        parts_agents = anon_by_part()
        agent_mib = (after - after_agents) / COUNT
        load_before = load_average()
        ticks = cpu_ticks()
        await anyio.sleep(IDLE_S)  # all idle: what they cost now is their keep-alive (and any health check)
        load_idle = load_average()
        now = cpu_ticks()
        busy_pct = 100 * (1 - (now[1] - ticks[1]) / max(1, now[0] - ticks[0]))
        start = time.perf_counter()
        listed = await lifecycle.rows(manager)
        list_s = time.perf_counter() - start
        start = time.perf_counter()
        pruned = await lifecycle.prune(manager, dry_run=True)
        prune_s = time.perf_counter() - start
        cli_list_s = cli_seconds(config_file, "list")
        cli_prune_s = cli_seconds(config_file, "prune", "--dry-run")
        start = time.perf_counter()
        for info in await manager.list():
            await manager.remove(info)
        remove_s = time.perf_counter() - start

        before_raw = settle()
        shims_before_raw = shim_count()

        # the same health checking as ours: the image's own check (a python3 exec a minute) at
        # 1,000 raw containers drove this host's load past 280 on 2026-12-07, and ours has none
        test = (client.images.get(IMAGE).attrs["Config"].get("Healthcheck") or {}).get("Test")
        raw_health = {"test": ["NONE"]} if not HEALTH_S or not test else {"test": test, "interval": HEALTH_S * 10**9}

        def raw(i: int):  # type: ignore[no-untyped-def]
            async def job() -> None:
                await anyio.to_thread.run_sync(
                    lambda: client.containers.run(
                        IMAGE,
                        ["sleep", "infinity"],
                        detach=True,
                        init=True,
                        labels={LABEL: "1"},
                        healthcheck=raw_health,
                    )
                )

            return job

        raw_s = await in_parallel([raw(i) for i in range(COUNT)], PARALLEL)
        after_raw = settle()
        raw_shims = shim_count() - shims_before_raw
        raw_per_mib = (before_raw - after_raw) / COUNT
        for container in client.containers.list(all=True, filters={"label": LABEL}):
            container.remove(force=True)
        await backend.aclose()

    engine = client.version()
    print(
        f"{COUNT} idle sandboxes, {PARALLEL} creations in flight (2 cores); Docker {engine['Version']} "
        f"(API {engine['ApiVersion']}), docker.shim: {agent.sandbox.docker.shim}\n"
    )
    print(f"{'operation':<52} {'ours':>10} {'raw SDK':>10} {'ratio':>7}")
    print(f"{'create all (wall s)':<52} {ours_s:>10.1f} {raw_s:>10.1f} {ours_s / raw_s:>7.2f}")
    print(
        f"{'create, per sandbox (ms, wall / count)':<52} {ours_s / COUNT * 1000:>10.0f} {raw_s / COUNT * 1000:>10.0f}"
    )
    print(f"{'containerd shim processes for them':<52} {shims:>10} {raw_shims:>10}")
    print(f"{'host memory per idle sandbox (MiB)':<52} {per_sandbox_mib:>10.1f} {raw_per_mib:>10.1f}")
    print(f"{'+ its resident agent, started (MiB)':<52} {agent_mib:>10.1f}")
    print(f"{'= per idle sandbox with its agent (MiB)':<52} {per_sandbox_mib + agent_mib:>10.1f}")
    print("  where it goes, per sandbox (anonymous MiB; sandbox / its agent):")
    for part in PARTS:
        made = (parts_after[part] - parts_before[part]) / COUNT
        started = (parts_agents[part] - parts_after[part]) / COUNT
        print(f"{'    ' + part:<52} {made:>10.2f} {started:>10.2f}")
    rest = per_sandbox_mib - sum(parts_after[p] - parts_before[p] for p in parts_after) / COUNT
    rest_agent = agent_mib - sum(parts_agents[p] - parts_after[p] for p in parts_after) / COUNT
    print(f"{'    the rest (kernel, tini and sleep, page cache)':<52} {rest:>10.2f} {rest_agent:>10.2f}")
    print(f"{f'load average (1 min) after {IDLE_S:.0f} s idle (before)':<52} {load_idle:>10.2f} {load_before:>10.2f}")
    print(f"{f'host CPU busy over those {IDLE_S:.0f} s (%, 2 cores)':<52} {busy_pct:>10.1f}")
    print(f"{'docker.health_interval_s (0: none)':<52} {HEALTH_S:>10}")
    print(f"{'first command in all, agents starting (wall s)':<52} {agents_s:>10.1f}")
    print(f"{'sandbox list with all present (s, rows)':<52} {list_s:>10.2f} {len(listed):>10}")
    print(f"{'prune --dry-run with all present (s)':<52} {prune_s:>10.2f} {len(pruned):>10}")
    print(f"{'  the CLI: sandbox list (s, best of 3)':<52} {cli_list_s:>10.2f}")
    print(f"{'  the CLI: sandbox prune --dry-run (s, best of 3)':<52} {cli_prune_s:>10.2f}")
    print(f"{'remove all, one at a time (s)':<52} {remove_s:>10.1f}")


if __name__ == "__main__":
    anyio.run(main)
