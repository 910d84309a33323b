"""The warm pool against the real engine: new sessions take started containers, never the same
one twice, never one that went back; scratch workspaces go with them; drifted, stopped and
half-claimed pool containers are removed, never handed out; a killed orchestrator leaves no
orphans; the service keeps the pool filled."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.runtime import manager as manager_module
from sandbox.runtime.docker.pool import CLAIM_GRACE_S
from sandbox.runtime.naming import CREATING_MARK, Labels
from sandbox.runtime.protocol import unclaimed
from tests.cli_helpers import run_cli

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


def pool_config(make_config: Any, size: int = 2, extra: str = "") -> Any:
    return make_config(f"""
agents:
  defaults: {{sandbox: {{mode: all, scope: session, pool: {{size: {size}}}{extra}}}}}
""")


async def members(orch: Any) -> list[Any]:
    return [i for i in await orch.manager.list() if unclaimed(i)]


async def exec_ok(orch: Any, session: str, command: str) -> str:
    result = await orch.session(session).call("exec", {"command": command})
    assert result.ok, result
    return str(result.output["output"])


async def test_new_sessions_take_warm_containers_each_its_own(make_config: Any) -> None:
    """Six sessions at once, a pool of two: every session gets a container of its own; the two
    pool containers went to two sessions and are no longer in the pool, which refills."""
    async with Orchestrator(pool_config(make_config)) as orch:
        assert await orch.fill_pools() == 2
        pooled = {i.id for i in await members(orch)}
        assert len(pooled) == 2
        ids: dict[str, str] = {}

        async def first_call(n: int) -> None:
            box: Any = await orch.session(f"agent:main:s{n}").sandbox()
            ids[f"s{n}"] = box.id
            assert (await exec_ok(orch, f"agent:main:s{n}", "echo $((6*7))")).strip() == "42"

        async with anyio.create_task_group() as tg:
            for n in range(6):
                tg.start_soon(first_call, n)
        assert len(set(ids.values())) == 6  # nobody shares
        assert pooled <= set(ids.values())  # both warm containers were handed out
        assert not pooled & {i.id for i in await members(orch)}  # ... and are not free any more
        assert await orch.fill_pools() == 2  # refilled with new ones
        assert not pooled & {i.id for i in await members(orch)}
        listed = {i.session: i for i in await orch.manager.list() if not unclaimed(i)}
        assert set(listed) == {f"agent:main:s{n}" for n in range(6)}  # handed-out ones show their session


async def test_the_scratch_workspace_goes_with_the_container(make_config: Any) -> None:
    """What the sandbox writes in /workspace is what the host-side file tools read, and stays
    the session's after the container is gone (like any scratch workspace)."""
    async with Orchestrator(pool_config(make_config, 1)) as orch:
        await orch.fill_pools()
        member = (await members(orch))[0]
        scratch = Path(member.labels[Labels.POOL_SCRATCH])
        sess = orch.session("agent:main:ws")
        await exec_ok(orch, "agent:main:ws", "echo from-the-sandbox > note.txt")
        read = await sess.call("read", {"path": "note.txt"})
        assert read.ok and read.output["content"] == "from-the-sandbox\n"
        wrote = await sess.call("write", {"path": "back.txt", "content": "from-the-host\n"})
        assert wrote.ok
        assert (await exec_ok(orch, "agent:main:ws", "cat back.txt")) == "from-the-host\n"
        box: Any = await sess.sandbox()
        assert box.id == member.id and not scratch.exists()
        assert (Path(box.spec.workspace.source) / "note.txt").read_text() == "from-the-sandbox\n"


async def test_a_session_with_a_workspace_already_keeps_it(make_config: Any) -> None:
    """A session whose scratch folder exists (its container was pruned) gets a new container on
    that folder, not a pool container with an empty one."""
    async with Orchestrator(pool_config(make_config, 1)) as orch:
        await exec_ok(orch, "agent:main:back", "echo kept > kept.txt")
        await orch.manager.close_session(orch.session("agent:main:back").agent, "agent:main:back")
        await orch.fill_pools()
        pooled = {i.id for i in await members(orch)}
        assert (await exec_ok(orch, "agent:main:back", "cat kept.txt")) == "kept\n"
        assert {i.id for i in await members(orch)} == pooled  # the pool was not used


async def test_a_session_whose_sandbox_exists_takes_no_member(make_config: Any) -> None:
    """A session that has a sandbox already (an earlier process made it) is not asked about first:
    the hand-over's rename to its name is refused, so it keeps its own container and the member
    goes back to the pool unchanged, free for the next session."""
    config = pool_config(make_config, 1, extra=", workspace_access: rw")
    async with Orchestrator(config) as orch:
        await exec_ok(orch, "agent:main:had", "echo mine > /tmp/marker")
        first: Any = await orch.session("agent:main:had").sandbox()
    async with Orchestrator(config) as orch:  # a new process: nothing of the session is cached
        await orch.fill_pools()
        pooled = {i.id for i in await members(orch)}
        assert pooled and first.id not in pooled
        assert (await exec_ok(orch, "agent:main:had", "cat /tmp/marker")) == "mine\n"
        box: Any = await orch.session("agent:main:had").sandbox()
        assert box.id == first.id
        assert {i.id for i in await members(orch)} == pooled  # untouched, still under pool names
        pool: Any = orch.manager.pool
        assert not any(pool.claims.claimed(member) for member in pooled)  # and free
        box2: Any = await orch.session("agent:main:next").sandbox()
        assert box2.id in pooled  # the next new session takes it


async def test_drifted_and_stopped_members_are_removed_never_handed_out(
    make_config: Any, docker_client: Any, tmp_path: Path
) -> None:
    """Pool containers of a config that changed, and ones that stopped (what an engine restart
    does to them), are swept; the new config's sessions never get them."""
    state = tmp_path / "shared-state"
    old = make_config("agents: {defaults: {sandbox: {mode: all, scope: session, pool: {size: 2}}}}", state=state)
    async with Orchestrator(old) as orch:
        await orch.fill_pools()
        drifted = {i.id for i in await members(orch)}
        stopped_one = next(iter(drifted))
        first_instance = orch.manager.instance
    docker_client.containers.get(stopped_one).kill()
    new = make_config(
        "agents: {defaults: {sandbox: {mode: all, scope: session, pool: {size: 1}, docker: {memory: 768m}}}}",
        state=state,
    )
    async with Orchestrator(new) as orch:
        box: Any = await orch.session("agent:main:after").sandbox()
        assert box.id not in drifted
        removed = await orch.manager.pool.sweep()
        assert len(removed) == 2
        # this test's instance only, without an inspect per container (another run's container
        # being removed, or an engine's stale entry, is none of its business)
        assert orch.manager.instance == first_instance  # the drifted members are listed too
        mine = {"label": [Labels.POOL, f"{Labels.INSTANCE}={orch.manager.instance}"]}
        left = {c.id for c in docker_client.containers.list(all=True, sparse=True, filters=mine)}
        assert not drifted & left


async def test_the_pool_stays_in_the_tenants_quota(make_config: Any) -> None:
    config = make_config("""
tenants: [{id: acme, quotas: {max_sandboxes: 2}}]
agents:
  defaults: {sandbox: {mode: all, scope: session, pool: {size: 5}}}
  list: [{id: main, tenant: acme}]
""")
    async with Orchestrator(config) as orch:
        assert await orch.fill_pools() == 2
        assert await orch.fill_pools() == 0


KILLED_SCRIPT = textwrap.dedent("""
    import sys, anyio
    from sandbox import Orchestrator, load_config
    async def main():
        async with Orchestrator(load_config(sys.argv[1])) as orch:
            await orch.fill_pools()
            r = await orch.session("agent:main:claimed").call("exec", {"command": "echo hi > mine.txt"})
            assert r.ok, r
            await orch.fill_pools()
            print("ready", flush=True)
            await anyio.sleep(600)
    anyio.run(main)
""")


def test_kill_9_of_the_orchestrator_leaves_no_orphans(tmp_path: Path, instance: str, docker_client: Any) -> None:
    """An orchestrator with a claimed and unclaimed pool containers is killed with -9 (one claim
    left half done, as a claimer killed mid-hand-over leaves it). After a restart the claimed
    session gets its own container back with its files, prune removes the half-claimed one, and
    nothing else of the pool is left but what the pool should hold."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, pool: {size: 2}}}}\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, str(cfg)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    label = {"label": [f"{Labels.INSTANCE}={instance}", Labels.POOL]}
    pool = docker_client.containers.list(all=True, filters=label)
    assert len(pool) == 3  # one handed out, two free
    free = [c for c in pool if c.name.startswith(f"sbx-{instance}-pool-")]
    # a claim whose claimer died before the rename
    half = free[0]
    claims = tmp_path / "state" / "pool" / "claims"
    (claims / half.id).write_text(
        json.dumps(
            {
                "container_id": half.id,
                "name": "sbx-never-renamed",
                "tenant": "default",
                "scope_key": "agent:main:lost",
                "session": "agent:main:lost",
                "config_hash": "x",
                "claimed_at": time.time() - CLAIM_GRACE_S - 1,
            }
        )
    )
    shown = run_cli("call", "--session", "agent:main:claimed", "exec", '{"command": "cat mine.txt"}', config=cfg)
    assert json.loads(shown.stdout)["output"]["output"] == "hi\n", shown.stdout
    pruned = run_cli("prune", "--json", config=cfg)
    assert pruned.returncode == 0, pruned.stderr
    assert half.name in pruned.stdout and "never handed out" in pruned.stdout
    remaining = {c.id for c in docker_client.containers.list(all=True, filters=label)}
    assert half.id not in remaining and len(remaining) == 2  # the claimed one and one free member
    assert not (claims / half.id).exists()
    for c in docker_client.containers.list(all=True, filters={"label": f"{Labels.INSTANCE}={instance}"}):
        c.remove(force=True)
    assert os.path.isdir(tmp_path / "state")


def test_the_service_keeps_the_pool_filled(make_config: Any, docker_client: Any, instance: str) -> None:
    """`sandbox serve` fills the pools at start and after each claim; a new session over HTTP
    gets a warm container."""
    import httpx

    from tests.service_helpers import TOKEN_A, serve, sha

    config = make_config(f"""
tenants: [{{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]
agents:
  defaults: {{sandbox: {{mode: all, scope: session, pool: {{size: 2}}}}}}
  list: [{{id: alpha, tenant: acme}}]
""")
    label = {"label": [f"{Labels.INSTANCE}={instance}", Labels.POOL]}

    def free() -> set[str]:
        return {c.id for c in docker_client.containers.list(filters=label) if "-pool-" in c.name}

    def wait_for_two() -> set[str]:
        deadline = time.monotonic() + 120
        while len(found := free()) < 2:
            assert time.monotonic() < deadline, "the pool was not filled"
            time.sleep(0.2)
        return found

    with serve(config) as url:
        warm = wait_for_two()
        r = httpx.post(
            f"{url}/v1/sessions/new/calls",
            headers={"Authorization": f"Bearer {TOKEN_A}"},
            json={"tool": "exec", "args": {"command": "true"}},
            timeout=120,
        )
        assert r.status_code == 200 and r.json()["ok"], r.text
        (session_box,) = [c for c in docker_client.containers.list(filters=label) if "-exec-agent-alpha-new" in c.name]
        assert session_box.id in warm  # the session's container was a warm one
        refilled = wait_for_two()
        assert session_box.id not in refilled


async def test_pool_containers_stopped_under_the_pool_cost_a_cold_start_not_a_failure(
    make_config: Any, docker_client: Any
) -> None:
    """An engine restart stops every pool container (they have no restart policy) while this
    process still counts them as free: the next session's first call still succeeds (on a new
    container), and the next fill replaces the dead ones."""
    async with Orchestrator(pool_config(make_config, 2)) as orch:
        await orch.fill_pools()
        dead = {i.id for i in await members(orch)}
        for cid in dead:
            docker_client.containers.get(cid).kill()
        assert (await exec_ok(orch, "agent:main:after-restart", "echo fine")) == "fine\n"
        box: Any = await orch.session("agent:main:after-restart").sandbox()
        assert box.id not in dead
        await orch.fill_pools()
        now = {i.id: i.status for i in await members(orch)}
        assert len(now) == 2 and not dead & set(now) and set(now.values()) == {"running"}
        mine = {"label": [Labels.POOL, f"{Labels.INSTANCE}={orch.manager.instance}"], "status": "exited"}
        left = docker_client.containers.list(all=True, sparse=True, filters=mine)
        assert not dead & {c.id for c in left}


class SecondEngine:
    """A dockerd of the test's own (its own socket, data and exec roots, network namespace, and no
    networks), so an engine restart can happen for real without touching the engine every other
    test uses."""

    def __init__(self, root: Path, storage_driver: str) -> None:
        self.root = root
        self.storage_driver = storage_driver
        self.sock = root / "docker.sock"
        root.mkdir(parents=True, exist_ok=True)
        (root / "daemon.json").write_text("{}")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import docker

        log = (self.root / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            [
                # a network namespace of its own: an engine started with --bridge=none removes
                # any `docker0` it sees, and the host's belongs to the main engine
                "unshare",
                "--net",
                "dockerd",
                f"--config-file={self.root / 'daemon.json'}",
                f"--data-root={self.root / 'data'}",
                f"--exec-root={self.root / 'exec'}",
                f"--pidfile={self.root / 'docker.pid'}",
                f"--host=unix://{self.sock}",
                "--bridge=none",
                "--iptables=false",
                "--ip-masq=false",
                f"--storage-driver={self.storage_driver}",  # the main engine's (vfs roots are 0700)
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 60
        while True:
            client = None
            try:
                # connectable first, on a socket closed here (docker-py leaks the socket of a
                # refused connection); a fixed API version, so making the client asks nothing
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.settimeout(2)
                    probe.connect(str(self.sock))
                client = docker.DockerClient(base_url=f"unix://{self.sock}", version="1.41")
                client.ping()
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.root / "dockerd.log").read_text()[-1500:]
                    raise AssertionError(f"the test's dockerd did not start:\n{tail}") from None
                time.sleep(0.3)
            finally:
                if client is not None:
                    client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # stops its containers (no live-restore), as a restart does
            self.proc.wait(timeout=120)
        self.proc = None


@pytest.fixture
def second_engine(docker_client: Any) -> Any:
    import shutil
    import tempfile

    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip("needs dockerd and root, to run an engine of the test's own")
    # a short path: containerd's socket lives below it, and a Unix socket path has 108 bytes
    interfaces = set(os.listdir("/sys/class/net"))  # the host's, which the test's engine must leave alone
    root = Path(tempfile.mkdtemp(prefix="sbx-engine-", dir="/tmp"))
    root.chmod(0o755)  # the sandbox user (not root) starts its container's init below it
    engine = SecondEngine(root, docker_client.info()["Driver"])
    engine.start()
    try:
        # the image, from the main engine (no registry): docker save | docker load
        save = subprocess.Popen(["docker", "save", "sandbox-exec:latest"], stdout=subprocess.PIPE)
        load = subprocess.run(
            ["docker", f"--host=unix://{engine.sock}", "load"], stdin=save.stdout, capture_output=True, timeout=300
        )
        assert save.wait(timeout=300) == 0 and load.returncode == 0, load.stderr
        assert save.stdout is not None
        save.stdout.close()
        yield engine
    finally:
        engine.stop()
        shutil.rmtree(engine.root, ignore_errors=True)
    assert interfaces <= set(os.listdir("/sys/class/net")), "the test's engine removed a host interface"


async def test_a_real_engine_restart_under_a_warm_pool(make_config: Any, second_engine: SecondEngine) -> None:
    """The engine restarts (its containers stop, every agent stream ends) while this process holds
    a warm pool and a session's sandbox: the session's next call and a new session's first call
    both succeed, the dead pool containers are replaced, and nothing stopped is left behind."""
    import docker

    from sandbox.runtime.docker.backend import DockerBackend

    client = docker.DockerClient(base_url=f"unix://{second_engine.sock}")
    backend = DockerBackend(client=client)
    async with Orchestrator(pool_config(make_config, 2), backend=backend) as orch:
        await orch.fill_pools()
        before = {i.id for i in await members(orch)}
        assert len(before) == 2
        assert (await exec_ok(orch, "agent:main:lived", "echo kept > kept.txt; echo ok")) == "ok\n"
        await anyio.to_thread.run_sync(second_engine.stop)
        await anyio.to_thread.run_sync(second_engine.start)
        # the session's sandbox stopped with the engine: it is made again, its workspace kept
        assert (await exec_ok(orch, "agent:main:lived", "cat kept.txt")) == "kept\n"
        # a new session: the pool this process counted on is dead; still served (cold)
        assert (await exec_ok(orch, "agent:main:fresh", "echo fresh")) == "fresh\n"
        await orch.fill_pools()
        now = await members(orch)
        assert len(now) == 2 and {i.status for i in now} == {"running"} and not before & {i.id for i in now}
        stopped = client.containers.list(all=True, filters={"status": "exited"})
        assert stopped == [], [c.name for c in stopped]
        for info in await orch.manager.list():
            await orch.manager.remove(info)


async def test_a_session_revalidated_is_not_offered_a_member(make_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 30 s a session's cached sandbox is looked at again; that session has a sandbox, so the
    engine is asked (one call) and no member is claimed for it (with replicas sharing claims in
    PostgreSQL, a refused claim would take the member out of every replica's pool)."""
    async with Orchestrator(pool_config(make_config, 1, extra=", workspace_access: rw")) as orch:
        await orch.fill_pools()
        await exec_ok(orch, "agent:main:live", "true")
        await orch.fill_pools()
        pooled = {i.id for i in await members(orch)}
        pool: Any = orch.manager.pool
        claimed: list[str] = []
        claim = pool.claim

        async def counted(spec: Any) -> Any:
            claimed.append(spec.session)
            return await claim(spec)

        monkeypatch.setattr(pool, "claim", counted)
        monkeypatch.setattr(manager_module, "REVALIDATE_AFTER_S", 0.0)  # every call revalidates
        for _ in range(3):
            await exec_ok(orch, "agent:main:live", "true")
        assert claimed == []
        assert {i.id for i in await members(orch)} == pooled


async def test_a_member_another_process_is_still_making_is_neither_swept_nor_claimed(
    make_config: Any, docker_client: Any
) -> None:
    """Another process on the state dir (the service beside a library caller) lists a member
    while it is still being made: under its `-creating-` name, not running yet. It was swept as a
    stopped member, its scratch folder with it, and the maker's start failed ("bind source path
    does not exist", seen once in CI's speed gate). Now it is left to its maker."""
    async with Orchestrator(pool_config(make_config, size=1)) as orch:
        assert await orch.fill_pools() == 1
        (member,) = await members(orch)
        container = docker_client.containers.get(member.id)
        container.stop(timeout=1)  # as between create and start: not running
        container.rename(f"{member.name[:40]}{CREATING_MARK}0123abcd")
        pool = orch.manager.pool
        assert pool is not None
        assert member.id not in {info.id for info, _ in await pool.stale()}
        assert await orch.fill_pools() == 1  # listed again: it is no free member, a new one is made
        box: Any = await orch.session("agent:main:fresh").sandbox()
        assert box.id != member.id  # not handed out either
        assert docker_client.containers.get(member.id).status == "exited"  # left to its maker


async def test_a_claim_file_goes_when_another_process_removed_its_container(
    make_config: Any, docker_client: Any
) -> None:
    """A CLI prune or a replica removes a claimed container: this process is not told, and its
    claim file would stay for good. The pool's periodic look drops it (older than the grace only),
    and keeps the claim of a container that still runs."""
    async with Orchestrator(pool_config(make_config, size=2)) as orch:
        assert await orch.fill_pools() == 2
        await exec_ok(orch, "agent:main:c1", "true")
        await exec_ok(orch, "agent:main:c2", "true")
        pool = orch.manager.pool
        claimed = sorted(pool.claims.ids())
        assert len(claimed) == 2
        gone, kept = claimed
        docker_client.api.remove_container(gone, force=True)  # elsewhere: no claim dropped here
        assert await pool.drop_lost_claims() == 0  # within the grace: a hand-over may be under way
        for container_id in claimed:  # both claimed long ago
            path = pool.claims.root / container_id
            record = json.loads(path.read_text())
            path.write_text(json.dumps({**record, "claimed_at": record["claimed_at"] - CLAIM_GRACE_S - 1}))
        assert await pool.drop_lost_claims() == 1
        assert sorted(pool.claims.ids()) == [kept]


async def test_the_pool_lists_its_own_members_only(make_config: Any) -> None:
    """The pool asks the engine for containers with its label only (the engine filters; at 1,000
    sandboxes that is 10 ms, not 300): members free or handed out, never a sandbox made cold, and
    each pool's free members by its own key."""
    async with Orchestrator(pool_config(make_config, size=1)) as orch:
        assert await orch.fill_pools() == 1
        warm = await orch.session("agent:main:w").sandbox()
        cold = await orch.session("agent:main:c").sandbox()  # the pool is empty now: made cold
        assert await orch.fill_pools() == 1
        pool: Any = orch.manager.pool
        listed = {i.id: i for i in await orch.manager.list()}
        members_now = {i.id for i in await pool._all_members()}
        assert warm.id in members_now and cold.id not in members_now
        assert members_now == {i for i, info in listed.items() if Labels.POOL in info.labels}
        free = [i for i in members_now if unclaimed(listed[i])]
        assert len(free) == 1
        key = listed[free[0]].labels[Labels.POOL]
        assert {i.id for i in await pool._members(key)} == {warm.id, free[0]}
        assert await pool._members("no-such-pool") == []
        assert await pool.stale() == []
