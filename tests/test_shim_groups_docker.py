"""A tenant's own containerd shims (`sandbox.docker.shim: tenant`), against the real engine.

Each sandbox's init process is a child of the shim that serves it, so the shim is read from
/proc: the parent of the container's State.Pid. Needs Docker Engine 24.0 or later (API 1.43), the
first that passes a container's annotations to containerd (scripts/docker-engine; CI runs it).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.docker import exec as exec_module
from sandbox.runtime.docker.backend import DockerBackend
from sandbox.runtime.docker.create import SHIM_GROUP, SHIM_SHARDS, groups_shims, shim_shard
from sandbox.runtime.docker.exec import SandboxGone, SandboxStopped, exec_stream

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

AGENTS = """
agents:
  defaults: {sandbox: {mode: all, scope: session}}
  list:
    - {id: a, tenant: t1}
    - {id: b, tenant: t1}
    - {id: c, tenant: t2}
"""


@pytest.fixture
def grouping_engine(docker_client: Any) -> Any:
    version = docker_client.version()
    if not groups_shims(version["ApiVersion"]):
        pytest.skip(f"Docker Engine {version['Version']} (API {version['ApiVersion']}) gives every container a shim")
    return docker_client


def parent_of(pid: int) -> int:
    # the field after the command's closing parenthesis (a command may hold spaces and parentheses)
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def shim_of(client: Any, container_id: str) -> int:
    pid = int(client.api.inspect_container(container_id)["State"]["Pid"])
    assert pid > 0, f"{container_id} is not running"
    shim = parent_of(pid)
    command = Path(f"/proc/{shim}/cmdline").read_bytes().split(b"\0")[0]
    assert command.endswith(b"containerd-shim-runc-v2"), (shim, command)
    return shim


async def box_of(orch: Orchestrator, session: str) -> str:
    result = await orch.session(session).call("exec", {"command": "echo up"})
    assert result.ok and "up" in result.output["output"], result
    return (await orch.session(session).sandbox()).id


def gone(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        # a zombie has been killed; only its parent's wait is missing
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.2)
    return False


def assert_stopped_under(result: Any) -> None:
    """A call that met its sandbox's container stopping says so, and may be made again."""
    assert result.error is not None and result.error.code == "SANDBOX_UNAVAILABLE", result
    assert result.error.retryable and "sandbox container stopped" in result.error.message, result


def keys_in_shard(shard: int, prefix: str, count: int) -> list[str]:
    """`count` session keys `<prefix><n>` whose sandboxes join shard `shard` of their tenant."""
    return [key for key in (f"{prefix}{n}" for n in range(256)) if shim_shard(key) == shard][:count]


async def test_a_tenants_sandboxes_share_its_shims_and_another_tenants_never(
    grouping_engine: Any, make_config: Any
) -> None:
    """Two agents of t1: sessions in one shard share one shim, a session in another shard has
    another; t2's session has its own. The group outlives the container that started its shim,
    and a later sandbox of t1 in that shard joins it."""
    client = grouping_engine
    shard = shim_shard("agent:a:x0")
    first, second = keys_in_shard(shard, "agent:a:x", 2)
    (third,) = keys_in_shard(shard, "agent:b:x", 1)
    (elsewhere,) = keys_in_shard((shard + 1) % SHIM_SHARDS, "agent:a:x", 1)
    async with Orchestrator(make_config(AGENTS), journal=False) as orch:
        boxes = {key: await box_of(orch, key) for key in (first, second, third, elsewhere, "agent:c:one")}
        shims = {key: shim_of(client, box) for key, box in boxes.items()}
        groups = {
            key: client.api.inspect_container(box)["HostConfig"]["Annotations"][SHIM_GROUP]
            for key, box in boxes.items()
        }
        assert shims[first] == shims[second] == shims[third] and groups[first] == groups[second] == groups[third]
        assert shims[elsewhere] != shims[first] and groups[elsewhere] != groups[first]
        assert groups[elsewhere].rsplit("-", 1)[0] == groups[first].rsplit("-", 1)[0]  # the tenant's other shard
        assert shims["agent:c:one"] not in (shims[first], shims[elsewhere])
        assert groups["agent:c:one"].rsplit("-", 1)[0] != groups[first].rsplit("-", 1)[0]

        # the container whose start made the shim goes (as `sandbox prune` would remove it)
        client.containers.get(boxes[first]).remove(force=True)
        assert os.path.exists(f"/proc/{shims[first]}"), "the shim went with the first container of its group"
        again = await orch.session(second).call("exec", {"command": "echo still"})
        assert (
            again.ok
            and "still" in again.output["output"]
            and (await orch.session(second).sandbox()).id == boxes[second]
        )
        (later,) = keys_in_shard(shard, "agent:b:y", 1)
        assert shim_of(client, await box_of(orch, later)) == shims[first]


async def test_a_shim_killed_takes_only_its_tenants_sandboxes_which_are_made_again(
    grouping_engine: Any, make_config: Any
) -> None:
    """SIGKILL to t1's shim: t2's sandbox never notices; t1's container processes are gone (not
    orphaned on the host), and t1's next call runs in a new sandbox."""
    client = grouping_engine
    async with Orchestrator(make_config(AGENTS), journal=False) as orch:
        mine = await box_of(orch, "agent:a:one")
        other = await box_of(orch, "agent:c:one")
        started = await orch.session("agent:c:one").call("exec", {"command": "echo before > t2.txt"})
        assert started.ok
        shim, other_shim = shim_of(client, mine), shim_of(client, other)
        init = int(client.api.inspect_container(mine)["State"]["Pid"])

        os.kill(shim, signal.SIGKILL)
        # at once, while the engine still reports the container running (it learns of the dead
        # shim 0.1-0.2 s later, more on a busy machine) and every exec in it fails with exit code
        # 126 and "ttrpc: closed": that never reaches the model as the command's result. The call
        # runs (the agent may outlive its shim a moment, in the old container or a new one), or
        # it says the sandbox stopped under it, and the model may try again.
        during = await orch.session("agent:a:one").call("exec", {"command": "echo during"})
        if during.ok:
            assert during.output["exit_code"] == 0 and "during" in during.output["output"], during
        else:
            assert_stopped_under(during)
        assert gone(shim)
        assert gone(init), "the killed shim's container kept running on the host"

        kept = await orch.session("agent:c:one").call("exec", {"command": "cat t2.txt"})
        assert kept.ok and kept.output["output"].strip() == "before", kept
        assert (await orch.session("agent:c:one").sandbox()).id == other and shim_of(client, other) == other_shim

        again = await orch.session("agent:a:one").call("exec", {"command": "echo back"})
        if not again.ok:  # the engine was slow to report the container stopped (a busy machine)
            assert_stopped_under(again)
            again = await orch.session("agent:a:one").call("exec", {"command": "echo back"})
        assert again.ok and "back" in again.output["output"], again
        remade = (await orch.session("agent:a:one").sandbox()).id
        assert remade != mine
        assert shim_of(client, remade) not in (shim, other_shim)


async def test_shim_container_gives_each_sandbox_its_own(docker_client: Any, make_config: Any) -> None:
    """`shim: container`: no annotation, and (on any engine) two sessions of one tenant, two shims."""
    config = make_config(
        "agents: {defaults: {sandbox: {mode: all, scope: session, docker: {shim: container}}}, list: [{id: a}]}"
    )
    async with Orchestrator(config, journal=False) as orch:
        one, two = await box_of(orch, "agent:a:one"), await box_of(orch, "agent:a:two")
        assert not docker_client.api.inspect_container(one)["HostConfig"].get("Annotations")
        assert shim_of(docker_client, one) != shim_of(docker_client, two)


async def test_an_exec_in_a_container_whose_shim_died_is_no_result(
    docker_client: Any, make_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after its shim dies, the engine still reports the container running but fails every
    exec in it (exit code 126, "ttrpc: closed" or no words, no process): that is an error saying the sandbox
    container stopped (not run again: the shim may have died while starting it), never a
    command's exit code 126; a live container's own 126 is its result at once. Any engine: one
    shim per container here."""
    settled: list[str] = []
    real_settle = exec_module.stopped_once_settled

    async def settle(backend: Any, container_id: str) -> bool:
        settled.append(container_id)
        return await real_settle(backend, container_id)

    monkeypatch.setattr(exec_module, "stopped_once_settled", settle)
    backend = DockerBackend()
    config = make_config(
        "agents: {defaults: {sandbox: {mode: all, scope: session, docker: {shim: container}}}, list: [{id: a}]}"
    )
    async with Orchestrator(config, backend=backend, journal=False) as orch:
        for attempt in range(3):  # the exec must reach the engine before it notices the shim died
            box = await box_of(orch, f"agent:a:dies{attempt}")
            os.kill(shim_of(docker_client, box), signal.SIGKILL)
            with pytest.raises(SandboxUnavailable) as info:
                await exec_stream(backend, box, ["echo", "ran"], timeout_s=30)
            if settled:
                break
            assert isinstance(info.value, SandboxGone), info.value  # it noticed first: refused at create
        assert settled == [box], "the engine noticed the dead shim before every exec, three times"
        # the engine's own words vary: "ttrpc: closed: unknown" from 26.1, nothing at all from 20.10
        assert isinstance(info.value, SandboxStopped), info.value
        assert "stopped while the command was starting" in info.value.message, info.value
        assert not isinstance(info.value, SandboxGone)  # which the sandbox would run again at once
        assert docker_client.api.inspect_container(box)["State"]["Status"] != "running"

        settled.clear()
        real = await exec_stream(backend, await box_of(orch, "agent:a:lives"), ["sh", "-c", "exit 126"], timeout_s=30)
        assert real.exit_code == 126 and settled == []


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_a_program_missing_from_a_live_sandbox_is_the_result_at_once(
    runtime: str, docker_client: Any, make_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine reached the container and found no such program (exit code 126 without a
    process, in runc's words or gVisor's): the engine's message is the result, with no wait for
    the container to stop."""
    if runtime not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip(f"the engine has no {runtime} runtime (scripts/runsc installs and registers it)")

    async def settle(backend: Any, container_id: str) -> bool:
        raise AssertionError("a live container was waited on")

    monkeypatch.setattr(exec_module, "stopped_once_settled", settle)
    backend = DockerBackend()
    config = make_config(
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: session, docker: {{runtime: {runtime}}}}}}}, list: [{{id: a}}]}}"
    )
    async with Orchestrator(config, backend=backend, journal=False) as orch:
        box = await box_of(orch, "agent:a:missing")
        missing = await exec_stream(backend, box, ["no-such-program"], timeout_s=30)
        assert missing.exit_code == 126 and b"no-such-program" in missing.output, missing


async def test_gvisor_sandboxes_never_share_a_shim_with_runc_ones(grouping_engine: Any, make_config: Any) -> None:
    """Under runsc a sandbox's shim is the same containerd-shim-runc-v2 driving the runsc binary:
    a tenant's gVisor sandboxes share theirs, and never one that drives runc for that tenant's
    other sandboxes in the same shard (the runtime is part of the group)."""
    client = grouping_engine
    if "runsc" not in (client.info().get("Runtimes") or {}):
        pytest.skip("the engine has no runsc runtime (scripts/runsc installs and registers it)")
    config = make_config("""
agents:
  defaults: {sandbox: {mode: all, scope: session}}
  list:
    - {id: g, tenant: t1, sandbox: {docker: {runtime: runsc}}}
    - {id: r, tenant: t1}
""")
    shard = shim_shard("agent:g:x0")
    first, second = keys_in_shard(shard, "agent:g:x", 2)
    (plain,) = keys_in_shard(shard, "agent:r:x", 1)
    async with Orchestrator(config, journal=False) as orch:
        boxes = {key: await box_of(orch, key) for key in (first, second, plain)}
        assert client.api.inspect_container(boxes[first])["HostConfig"]["Runtime"] == "runsc"
        assert client.api.inspect_container(boxes[plain])["HostConfig"]["Runtime"] != "runsc"
        shims = {key: shim_of(client, box) for key, box in boxes.items()}
        assert shims[first] == shims[second]
        assert shims[plain] != shims[first]
