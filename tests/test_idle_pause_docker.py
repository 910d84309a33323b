"""Pausing idle sandboxes (`sandbox.idle_pause_s`) on the real engine: an idle sandbox is frozen
(its cgroup's CPU time does not grow, even under a busy background process), `sandbox list`
says paused, the next call thaws it and works; a sandbox a call uses is never paused; with
`idle_pause_keeps_processes` one running a background process stays running; another process
(a fresh orchestrator) finds a paused sandbox and thaws it instead of making a new one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.runtime.lifecycle import pause_idle

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]
BUSY = "while :; do :; done"


def _config(make_config: Any, keeps: bool = False) -> Any:
    keep = ", idle_pause_keeps_processes: true" if keeps else ""
    return make_config(
        "agents: {defaults: {sandbox: {mode: all, scope: session, idle_pause_s: 1" + keep + "}}, list: [{id: main}]}"
    )


def _cpu_ns(docker_client: Any, name: str) -> int:
    """The container's cgroup CPU time in ns, read on the host (no exec into a frozen container):
    cgroup v1's cpuacct.usage, or v2's cpu.stat usage_usec."""
    pid = docker_client.api.inspect_container(name)["State"]["Pid"]
    paths = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path.lstrip("/")
    if "cpuacct" in paths:  # v1 (or hybrid: the cpu controllers are on v1 there)
        return int(Path("/sys/fs/cgroup/cpuacct", paths["cpuacct"], "cpuacct.usage").read_text())
    stat = Path("/sys/fs/cgroup", paths[""], "cpu.stat").read_text()
    return 1000 * int(next(line.split()[1] for line in stat.splitlines() if line.startswith("usage_usec")))


def _status(docker_client: Any, name: str) -> str:
    return str(docker_client.api.inspect_container(name)["State"]["Status"])


async def test_an_idle_sandbox_is_frozen_and_the_next_call_thaws_it(make_config: Any, docker_client: Any) -> None:
    async with Orchestrator(_config(make_config)) as orch:
        session = orch.session(agent="main", key="agent:main:p1")
        started = await session.call("exec", {"command": BUSY, "background": True})
        assert started.ok, started.error
        name = orch.manager.spec_for(orch.session(agent="main", key="agent:main:p1").agent, session.key).name
        await anyio.sleep(1.2)
        paused = await pause_idle(orch.manager)
        assert [n for n, _ in paused] == [name] and _status(docker_client, name) == "paused"
        assert {i.name: i.status for i in await orch.manager.list()}[name] == "paused"
        before = _cpu_ns(docker_client, name)
        await anyio.sleep(1.0)
        assert _cpu_ns(docker_client, name) == before  # frozen: the busy loop gets no CPU
        thawed = await session.call("exec", {"command": "echo awake"})
        assert thawed.ok and thawed.output["output"].strip() == "awake"
        assert _status(docker_client, name) == "running"
        again = _cpu_ns(docker_client, name)
        await anyio.sleep(0.5)
        assert _cpu_ns(docker_client, name) > again  # the background process runs again
        await session.close()


async def test_a_sandbox_under_a_call_is_never_paused(make_config: Any, docker_client: Any) -> None:
    async with Orchestrator(_config(make_config)) as orch:
        session = orch.session(agent="main", key="agent:main:p2")
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.call, "exec", {"command": "sleep 3"})
            await anyio.sleep(2)  # the call has run for longer than idle_pause_s
            assert await pause_idle(orch.manager) == []
        assert await pause_idle(orch.manager) == []  # it was used just now
        await session.close()


async def test_with_keeps_processes_a_busy_sandbox_stays_running(make_config: Any, docker_client: Any) -> None:
    async with Orchestrator(_config(make_config, keeps=True)) as orch:
        busy = orch.session(agent="main", key="agent:main:p3")
        idle = orch.session(agent="main", key="agent:main:p4")
        assert (await busy.call("exec", {"command": BUSY, "background": True})).ok
        assert (await idle.call("exec", {"command": "true"})).ok
        await anyio.sleep(1.2)
        paused = [n for n, _ in await pause_idle(orch.manager)]
        idle_name = orch.manager.spec_for(idle.agent, idle.key).name
        busy_name = orch.manager.spec_for(busy.agent, busy.key).name
        assert paused == [idle_name] and _status(docker_client, busy_name) == "running"
        await busy.close()
        await idle.close()


async def test_another_process_thaws_a_paused_sandbox_instead_of_replacing_it(
    make_config: Any, docker_client: Any
) -> None:
    config = _config(make_config)
    async with Orchestrator(config) as orch:
        session = orch.session(agent="main", key="agent:main:p5")
        assert (await session.call("exec", {"command": "echo kept > /tmp/mark"})).ok
        name = orch.manager.spec_for(session.agent, session.key).name
        container_id = docker_client.api.inspect_container(name)["Id"]
        await anyio.sleep(1.2)
        assert [n for n, _ in await pause_idle(orch.manager)] == [name]
    started = time.monotonic()
    async with Orchestrator(config) as other:
        later = other.session(agent="main", key="agent:main:p5")
        read = await later.call("exec", {"command": "cat /tmp/mark"})
        assert read.ok and read.output["output"].strip() == "kept", read  # the same container, thawed
        assert docker_client.api.inspect_container(name)["Id"] == container_id
        assert time.monotonic() - started < 60
        await later.close()


async def test_a_paused_sandbox_removed_leaves_no_pause_state(make_config: Any, docker_client: Any) -> None:
    """Prune removes idle sandboxes, which are the paused ones: a month of them must not stay in
    the manager's paused set and pause locks."""
    async with Orchestrator(_config(make_config)) as orch:
        session = orch.session(agent="main", key="agent:main:p9")
        assert (await session.call("exec", {"command": "true"})).ok
        await anyio.sleep(1.2)
        paused = await pause_idle(orch.manager)
        name = paused[0][0]
        assert name in orch.manager.paused and name in orch.manager._freeze_locks
        info = next(i for i in await orch.manager.list() if i.name == name)
        await orch.manager.remove(info)
        assert name not in orch.manager.paused and name not in orch.manager._freeze_locks
        assert name not in orch.manager.last_used()
