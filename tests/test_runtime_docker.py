"""Sandboxes on the real engine: scopes, workspaces, hardening, drift, adoption, failures."""

from __future__ import annotations

import gc
import os
import re
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.errors import ErrorCode, SandboxError
from sandbox.runtime.docker.backend import DockerBackend
from sandbox.runtime.naming import Labels
from tests.call_helpers import killed_mid_call

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


async def run(session: Any, command: str, **kw: Any) -> dict[str, Any]:
    result = await session.call("exec", {"command": command, **kw})
    assert result.ok or result.error.code == "TIMEOUT", result
    output: dict[str, Any] = result.output
    return output


@pytest.mark.parametrize(
    ("scope", "mode"),
    [
        ("session", "non-main"),
        ("agent", "non-main"),
        ("shared", "non-main"),
        ("session", "all"),
        ("agent", "all"),
    ],
)
async def test_mode_and_scope_map_sessions_to_containers(make_config: Any, scope: str, mode: str) -> None:
    """Each mode x scope maps sessions to the right containers; close removes only session scope."""
    config = make_config(f"""
agents:
  defaults: {{sandbox: {{mode: {mode}, scope: {scope}}}}}
  list: [{{id: a}}, {{id: b}}]
""")
    async with Orchestrator(config) as orch:
        a1, a2, b1 = (
            orch.session("agent:a:one"),
            orch.session("agent:a:two"),
            orch.session("agent:b:one"),
        )
        main = orch.session("agent:a:main")
        assert main.sandboxed == (mode == "all")
        ids = {}
        for name, sess in (("a1", a1), ("a2", a2), ("b1", b1)):
            ids[name] = (await sess.sandbox()).id
        if scope == "session":
            assert len(set(ids.values())) == 3
        elif scope == "agent":
            assert ids["a1"] == ids["a2"] != ids["b1"]
        else:
            assert ids["a1"] == ids["a2"] == ids["b1"]
        if mode == "non-main":
            result = await main.call("exec", {"command": "echo host-$$"})
            assert result.ok and result.output["output"].startswith("host-")
            assert await main.sandbox() is None
        await a1.close()
        remaining = {c.id for c in await orch.manager.list()}
        assert (ids["a1"] in remaining) == (scope != "session")
        assert ids["b1"] in remaining


async def test_workspace_access_ro_rw_none(make_config: Any, tmp_path: Path) -> None:
    """ro: writes inside fail with EROFS; rw: the host sees the file; none: the workspace is invisible."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "secret.txt").write_text("agent workspace\n")
    os.chown(ws, 1000, 1000)
    for access in ("ro", "rw", "none"):
        config = make_config(f"""
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: {access}}}}}
  list: [{{id: a, workspace: "{ws}"}}]
""")
        async with Orchestrator(config) as orch:
            sess = orch.session(f"agent:a:{access}")
            out = await run(sess, f"cat secret.txt; echo made-by-{access} > new-{access}.txt; echo rc=$?")
            if access == "ro":
                assert "agent workspace" in out["output"]
                assert "Read-only file system" in out["output"]
                assert not (ws / "new-ro.txt").exists()
            elif access == "rw":
                assert "agent workspace" in out["output"]
                assert (ws / "new-rw.txt").read_text() == "made-by-rw\n"
            else:
                assert "agent workspace" not in out["output"]
                assert "No such file" in out["output"]
                assert not (ws / "new-none.txt").exists()
            await sess.close()


async def test_hardening_visible_in_inspect_and_inside(make_config: Any, docker_client: Any) -> None:
    """Caps, no-new-privs, non-root, no network, read-only root, limits: in inspect and from inside."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: session}}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:hard")
        box = await sess.sandbox()
        attrs = docker_client.api.inspect_container(box.id)
        host = attrs["HostConfig"]
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
        assert "no-new-privileges:true" in host["SecurityOpt"]
        assert host["ReadonlyRootfs"] is True
        assert host["NetworkMode"] == "none"
        assert host["PidsLimit"] == 256
        assert host["Memory"] == 1024**3 and host["MemorySwap"] == 1024**3
        assert host["NanoCpus"] == 10**9
        assert host["Init"] is True
        assert host["RestartPolicy"]["Name"] == "no"
        assert not host["PortBindings"]
        assert set(host["Tmpfs"]) == {"/tmp", "/var/tmp", "/run"} and all("size=" in v for v in host["Tmpfs"].values())
        assert attrs["Config"]["User"] == "1000:1000"
        assert all(m["Propagation"] in ("rprivate", "") for m in attrs["Mounts"])
        out = (
            await run(
                sess,
                "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; id -u; ls /sys/class/net; "
                "touch /etc/x 2>&1; touch /usr/x 2>&1; find / -xdev -perm /6000 -type f 2>/dev/null | wc -l",
            )
        )["output"]
        assert "CapEff:\t0000000000000000" in out
        assert "NoNewPrivs:\t1" in out
        lines = out.splitlines()
        assert "1000" in lines
        assert "lo" in lines and not any(x.startswith(("eth", "veth")) for x in lines)
        assert out.count("Read-only file system") == 2
        assert lines[-1].strip() == "0"  # no setuid/setgid binaries


async def test_fork_bomb_hits_pids_limit_and_host_stays_responsive(make_config: Any, docker_client: Any) -> None:
    """A fork bomb stops at the pids limit, the host keeps answering, and the timeout kills it all."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: session, docker: {pids_limit: 64}}}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:bomb")
        box = await sess.sandbox()
        results: list[Any] = []

        async def bomb() -> None:
            results.append(
                await sess.call(
                    "exec", {"command": "bomb() { bomb | bomb & }; bomb; while :; do :; done", "timeout_s": 6}
                )
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(bomb)
            peak = 0
            for _ in range(20):
                await anyio.sleep(0.2)
                peak = max(peak, len(docker_client.api.top(box.id)["Processes"]))
            assert subprocess.run(["true"], timeout=5).returncode == 0  # the host still answers
        assert peak <= 64, peak
        # the main shell loops on builtins (it needs no fork), so the call runs into its timeout
        # and everything it started is killed: nothing of the bomb may be left afterwards
        assert results[0].error and results[0].error.code == "TIMEOUT", results[0]
        after = await sess.call(
            "exec",
            {
                "command": "echo alive; cat /sys/fs/cgroup/pids.events 2>/dev/null || cat /sys/fs/cgroup/pids/pids.events; "
                "echo \"LIVE $(ps -e -o stat= | grep -vc '^Z')\"; ps -e -o pid=,pgid=,stat=,args="
            },
        )
        assert after.ok and "alive" in after.output["output"]
        out = after.output["output"].split()
        assert out[out.index("max") + 1] != "0"  # forks were refused at the limit
        # the bomb is gone (killed ones the init has not reaped yet are zombies); on failure the
        # process list (stderr, merged) says what survived
        found = re.search(r"LIVE (\d+)", after.output["output"])
        assert found is not None, after.output["output"]
        live = int(found.group(1))
        assert live < 10, after.output["output"]


async def test_memory_hog_is_oom_killed(make_config: Any) -> None:
    """A process allocating past the memory limit is killed; the sandbox survives."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: session, docker: {memory: 64m}}}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:oom")
        out = await run(
            sess,
            "python3 -c 'x = bytearray(512 * 1024 * 1024); print(len(x))'; echo rc=$?",
            timeout_s=60,
        )
        assert "rc=137" in out["output"]
        assert "536870912" not in out["output"]
        # the hog as the whole command: killed from outside is never ok, and says why
        hog = await sess.call("exec", {"command": "echo before; python3 -c 'x = bytearray(512 * 1024 * 1024)'"})
        assert not hog.ok and hog.error is not None and hog.error.code == ErrorCode.KILLED, hog
        assert "memory is 64m" in hog.error.message
        assert hog.output["exit_code"] == 137
        assert "before" in hog.output["output"]
        again = await run(sess, "echo still-here")
        assert "still-here" in again["output"]


async def test_a_command_killed_by_another_orchestrator_reports_killed(make_config: Any) -> None:
    """Another process's recovery took this call's owner for gone (its lease lapsed) and killed the
    command: the live owner reports KILLED with the journal's reason, never ok with exit 137."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: agent}}}")
    async with Orchestrator(config) as orch, Orchestrator(config) as other:
        sess = orch.session("agent:main:victim")
        await run(sess, "true")  # the container exists before the race starts
        assert other.journal is not None
        from sandbox.engine import recovery

        async def settle(call_id: str, owner: str) -> None:
            # what the other process's recovery does to a call whose owner it takes for gone
            assert other.journal is not None
            last = other.journal.events(call_id=call_id)[-1]
            assert await recovery._settle(other, last, owner) == "abandoned"

        result = await killed_mid_call(sess, other.journal, "echo started; sleep 300", settle, settle_s=0.5)
    assert result is not None and not result.ok and result.error.code == ErrorCode.KILLED, result
    assert "found gone" in result.error.message and "another orchestrator" in result.error.message
    assert socket.gethostname() not in result.error.message  # the owner's identity stays in the journal
    assert "started" in result.output["output"]
    assert result.duration_ms < 200_000  # it ended with the kill, not after the sleep


async def test_allowed_bind_is_read_only_by_default(make_config: Any, tmp_path: Path) -> None:
    """A valid extra bind is mounted read-only unless it says rw."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.txt").write_text("shared data\n")
    config = make_config(
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: session, docker: {{binds: ['{data}:/mnt/data']}}}}}}}}"
    )
    async with Orchestrator(config) as orch:
        out = await run(
            orch.session("agent:main:bind"),
            "cat /mnt/data/f.txt; echo x > /mnt/data/g 2>&1; echo rc=$?",
        )
        assert "shared data" in out["output"] and "Read-only file system" in out["output"]
        assert not (data / "g").exists()


async def test_drift_recreates_and_unchanged_reuses(make_config: Any, tmp_path: Path) -> None:
    """Changing env or a bind recreates the container on next use; no change reuses it."""
    data = tmp_path / "d"
    data.mkdir()
    base = "agents: {defaults: {sandbox: {mode: all, scope: agent%s}}}"
    state = tmp_path / "state"

    async def container_id(extra: str) -> str:
        async with Orchestrator(make_config(base % extra, state=state)) as orch:
            return str((await orch.session("agent:main:x").sandbox()).id)

    first = await container_id("")
    assert await container_id("") == first
    with_env = await container_id(", docker: {env: {FOO: bar}}")
    assert with_env != first
    with_bind = await container_id(f", docker: {{env: {{FOO: bar}}, binds: ['{data}:/mnt/d']}}")
    assert with_bind != with_env
    assert await container_id(f", docker: {{env: {{FOO: bar}}, binds: ['{data}:/mnt/d']}}") == with_bind


async def test_twenty_concurrent_first_calls_create_one_container(
    make_config: Any, docker_client: Any, instance: str
) -> None:
    """20 parallel first calls for one scope create exactly one container."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: agent}}}")
    async with Orchestrator(config) as orch:
        results: list[Any] = []

        async def one(i: int) -> None:
            results.append(await orch.session(f"agent:main:s{i}").call("exec", {"command": "hostname"}))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
        assert all(r.ok for r in results)
        containers = docker_client.containers.list(all=True, filters={"label": f"{Labels.INSTANCE}={instance}"})
        assert len(containers) == 1


RESTART_SCRIPT = """
import anyio, sys
from sandbox import Orchestrator, load_config
async def main():
    async with Orchestrator(load_config(sys.argv[1])) as orch:
        box = await orch.session("agent:main:restart").sandbox()
        print(box.id)
anyio.run(main)
"""


def _write_config(path: Path, state: Path, instance: str, extra: str = "") -> Path:
    path.write_text(
        f"state_dir: {state}\ninstance: {instance}\nagents: {{defaults: {{sandbox: {{mode: all, scope: agent{extra}}}}}}}\n"
    )
    return path


async def test_new_process_adopts_existing_container(tmp_path: Path, instance: str) -> None:
    """A second orchestrator process finds the first one's container by label and adopts it."""
    cfg = _write_config(tmp_path / "c.yaml", tmp_path / "state", instance)
    ids = [
        subprocess.run(
            [sys.executable, "-c", RESTART_SCRIPT, str(cfg)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout.strip()
        for _ in range(2)
    ]
    assert ids[0] == ids[1] and len(ids[0]) == 64


async def test_kill_during_creation_leaves_nothing_unadopted(tmp_path: Path, instance: str, docker_client: Any) -> None:
    """kill -9 mid-creation (during a slow setup_command) leaves an orphan the next start removes."""
    cfg = _write_config(tmp_path / "c.yaml", tmp_path / "state", instance, ", docker: {setup_command: 'sleep 30'}")
    proc = subprocess.Popen(
        [sys.executable, "-c", RESTART_SCRIPT, str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    label = {"label": f"{Labels.INSTANCE}={instance}"}
    deadline = time.monotonic() + 60
    # sparse: a full list inspects each container, and one removed in between is a 404
    while time.monotonic() < deadline and not docker_client.containers.list(all=True, filters=label, sparse=True):
        await anyio.sleep(0.1)
    await anyio.sleep(0.5)
    proc.kill()
    proc.wait()
    leftovers = docker_client.containers.list(all=True, filters=label)
    assert len(leftovers) == 1 and "-creating-" in leftovers[0].name
    from sandbox import load_config
    from sandbox.runtime.manager import SandboxManager

    manager = SandboxManager(load_config(cfg), DockerBackend())
    removed = await manager.cleanup_orphans()
    await manager.backend.aclose()
    assert removed == [leftovers[0].name]
    assert docker_client.containers.list(all=True, filters=label) == []


async def test_orphans_of_an_earlier_service_container_are_removed(
    tmp_path: Path, instance: str, docker_client: Any
) -> None:
    """compose runs the service as pid 1 on the host's hostname: a half-created container of an
    earlier service container names a pid that is alive again (the new one's), so the creator is
    told by its start time too. Its leftover goes; one this live process is making stays."""
    from sandbox import load_config
    from sandbox.journal.owners import current_owner
    from sandbox.runtime.manager import SandboxManager
    from sandbox.runtime.naming import CREATOR_LABEL

    host, boot, pid, start = current_owner().split("|")
    earlier = f"{host}|{boot}|{pid}|{int(start) - 1}"  # this pid, started at another time
    made = {}
    for who, creator in (("earlier", earlier), ("live", current_owner())):
        made[who] = docker_client.containers.create(
            "sandbox-exec:latest",
            ["true"],
            name=f"sbx-{instance}-x-creating-{who}",
            labels={Labels.MANAGED: "true", Labels.INSTANCE: instance, CREATOR_LABEL: creator},
        ).name
    cfg = _write_config(tmp_path / "c.yaml", tmp_path / "state", instance)
    manager = SandboxManager(load_config(cfg), DockerBackend())
    try:
        removed = await manager.cleanup_orphans()
    finally:
        await manager.backend.aclose()
    left = [c.name for c in docker_client.containers.list(all=True, filters={"label": f"{Labels.INSTANCE}={instance}"})]
    assert removed == [made["earlier"]] and left == [made["live"]]
    docker_client.containers.get(made["live"]).remove(force=True)


async def test_dead_container_is_recreated_on_next_use(make_config: Any, docker_client: Any) -> None:
    """A container removed behind our back is replaced on the next call (nothing had started in it)."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: agent}}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:dead")
        first = (await sess.sandbox()).id
        docker_client.containers.get(first).remove(force=True)
        again = await sess.call("exec", {"command": "echo back"})
        assert again.ok and "back" in again.output["output"]
        assert (await sess.sandbox()).id != first


async def test_setup_command_failure_removes_container(make_config: Any, docker_client: Any, instance: str) -> None:
    """A failing setup_command removes the container and says why."""
    config = make_config(
        "agents: {defaults: {sandbox: {mode: all, docker: {setup_command: 'echo broken >&2; exit 3'}}}}"
    )
    async with Orchestrator(config) as orch:
        result = await orch.session("agent:main:setup").call("exec", {"command": "true"})
    assert result.error.code == "SANDBOX_UNAVAILABLE"
    assert "setup_command failed (exit 3" in result.error.message and "broken" in result.error.message
    assert docker_client.containers.list(all=True, filters={"label": f"{Labels.INSTANCE}={instance}"}) == []


async def test_setup_command_runs_once_as_root_only_when_asked(make_config: Any) -> None:
    """setup_command runs once after create, as root only with setup_as_root."""
    config = make_config(
        "agents: {defaults: {sandbox: {mode: all, docker: {setup_command: 'id -u > /tmp/setup-uid', setup_as_root: true}}}}"
    )
    async with Orchestrator(config) as orch:
        out = await run(orch.session("agent:main:setup2"), "cat /tmp/setup-uid")
    assert out["output"].strip() == "0"


async def test_engine_unreachable_is_sandbox_unavailable(make_config: Any, tmp_path: Path) -> None:
    """A backend whose engine does not answer gives SANDBOX_UNAVAILABLE and creates nothing."""
    import docker

    client = docker.DockerClient(base_url=f"unix://{tmp_path}/no-engine.sock", version="1.41")
    config = make_config("agents: {defaults: {sandbox: {mode: all}}}")
    with warnings.catch_warnings():
        # docker-py's unix transport does not close a socket whose connect() failed
        warnings.simplefilter("ignore", ResourceWarning)
        async with Orchestrator(config, backend=DockerBackend(client)) as orch:
            result = await orch.session("agent:main:x").call("exec", {"command": "true"})
        gc.collect()
    assert result.error.code == "SANDBOX_UNAVAILABLE"
    assert not list(tmp_path.glob("state/sandboxes/*")), "nothing is prepared when the engine is down"
    assert "unreachable" in result.error.message


async def test_missing_image_names_images_build(make_config: Any) -> None:
    """A missing image is an error that names `sandbox images build`."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, docker: {image: 'sandbox-nope:missing'}}}}")
    async with Orchestrator(config) as orch:
        result = await orch.session("agent:main:x").call("exec", {"command": "true"})
    assert result.error.code == "SANDBOX_UNAVAILABLE"
    assert "sandbox images build" in result.error.message


async def test_browser_cdp_only_on_its_own_network_and_unreachable_from_exec(
    make_config: Any, docker_client: Any
) -> None:
    """CDP answers the host at the browser's address on its own internal network; nothing is
    published, and an exec sandbox on the bridge network cannot reach it."""
    import json
    import urllib.request

    config = make_config("""
tools: {sandbox: {tools: {also_allow: [browser]}}}
agents: {defaults: {sandbox: {mode: all, scope: agent, browser: {enabled: true}, docker: {network: bridge}}}}
""")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:web")
        endpoint = await sess.browser()
        with urllib.request.urlopen(f"{endpoint.cdp_url}/json/version", timeout=5) as response:
            assert "Browser" in json.loads(response.read())
        attrs = docker_client.api.inspect_container(endpoint.container_id)
        assert not any(attrs["NetworkSettings"]["Ports"].values())  # nothing published on the host
        assert list(attrs["NetworkSettings"]["Networks"]) == [endpoint.network]
        assert endpoint.network.startswith("sandbox-browser-")
        assert docker_client.api.inspect_network(endpoint.network)["Internal"] is True
        ip = attrs["NetworkSettings"]["Networks"][endpoint.network]["IPAddress"]
        assert endpoint.cdp_url == f"http://{ip}:9222"
        box = await sess.sandbox()
        exec_nets = docker_client.api.inspect_container(box.id)["NetworkSettings"]["Networks"]
        assert endpoint.network not in exec_nets
        out = await run(sess, f"curl -sS --max-time 3 http://{ip}:9222/json/version; echo rc=$?")
        assert "rc=0" not in out["output"] and "Browser" not in out["output"]


async def test_browser_refused_when_policy_denies(make_config: Any) -> None:
    """The browser sandbox is not started when policy removes the browser tool."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, browser: {enabled: true}}}}")
    async with Orchestrator(config) as orch:
        with pytest.raises(SandboxError) as info:
            await orch.session("agent:main:web").browser()
    assert info.value.code == ErrorCode.PERMISSION_DENIED


async def test_drift_log_names_changed_keys(make_config: Any, tmp_path: Path) -> None:
    """Recreation on drift is logged with the config keys that changed."""
    from loguru import logger

    lines: list[str] = []
    logger.enable("sandbox")
    sink = logger.add(lambda m: lines.append(f"{m.record['message']} {m.record['extra']}"), level="INFO")
    try:
        state = tmp_path / "state"
        for extra in ("", ", docker: {env: {X: '1'}, pids_limit: 100}"):
            config = make_config(f"agents: {{defaults: {{sandbox: {{mode: all{extra}}}}}}}", state=state)
            async with Orchestrator(config) as orch:
                await orch.session("agent:main:d").sandbox()
    finally:
        logger.remove(sink)
        logger.disable("sandbox")
    drift = [line for line in lines if line.startswith("sandbox_config_drift")]
    assert len(drift) == 1 and "'env'" in drift[0] and "'limits'" in drift[0]


async def test_runtime_is_selectable(make_config: Any, docker_client: Any) -> None:
    """docker.runtime picks the OCI runtime (visible in inspect); an unknown one is a clear error."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, docker: {runtime: runc}}}}")
    async with Orchestrator(config) as orch:
        box = await orch.session("agent:main:rt").sandbox()
        assert docker_client.api.inspect_container(box.id)["HostConfig"]["Runtime"] == "runc"
    config = make_config("agents: {defaults: {sandbox: {mode: all, docker: {runtime: no-such-runtime}}}}")
    async with Orchestrator(config) as orch:
        result = await orch.session("agent:main:rt2").call("exec", {"command": "true"})
    assert not result.ok and "no-such-runtime" in result.error.message


async def test_a_command_silent_for_longer_than_the_control_timeout_still_runs(make_config: Any) -> None:
    """The engine client's timeout bounds control calls, not a command's output stream: a docker
    exec silent for longer than it finishes normally (by docker exec, without the agent)."""
    from sandbox.runtime.docker.exec import exec_stream

    backend = DockerBackend(timeout_s=4)
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: session}}}")
    async with Orchestrator(config, backend=backend) as orch:
        box = await orch.session("agent:main:quiet").sandbox()
        result = await exec_stream(backend, box.id, ["sh", "-c", "sleep 7; echo done"], timeout_s=60)
    assert result.exit_code == 0 and result.output == b"done\n", result
