"""The resident agent in real sandboxes: the same results as docker exec, one agent per user, and
the faults an untrusted sandbox can cause it (killed, stopped, forged or oversized frames), each
costing only that sandbox's call. Images without a working agent fall back to docker exec."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.runtime.agent import link as agent_link
from tests.cli_helpers import run_cli

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

HANG_GUARD_S = 90  # a guard against hanging, not a performance claim


def config_for(make_config: Any, agent: str = "auto", image: str = "sandbox-exec:latest", extra: str = "") -> Any:
    return make_config(f"""
agents:
  defaults: {{sandbox: {{mode: all, scope: agent, docker: {{agent: '{agent}', image: '{image}'}}{extra}}}}}
  list: [{{id: a}}]
""")


async def outputs(sess: Any, command: str, **kw: Any) -> dict[str, Any]:
    """What a command printed (stdout and stderr apart), its exit code, and the error code if any."""
    result = await sess.call("exec", {"command": command, "merge_output": False, **kw})
    assert result.ok or result.error.code in ("TIMEOUT", "KILLED"), result
    out: dict[str, Any] = result.output
    return {
        "exit_code": out.get("exit_code"),
        "stdout": out.get("stdout"),
        "stderr": out.get("stderr"),
        "error": result.error.code if result.error else None,
    }


COMMANDS = [
    "echo out; echo err >&2; exit 3",
    "pwd; id -u; echo $HOME",
    "printf 'a\\0b\\377' | od -c | head -1",
    "sh -c 'kill -9 $$'",
    "mkdir -p sub && cd sub && pwd",
    "yes line | head -c 200000 | wc -c",
    "sleep 30",
]


async def test_the_agent_path_gives_what_docker_exec_gives(make_config: Any) -> None:
    """Every command gives the same exit code and outputs through the agent and through docker exec."""
    results: dict[str, list[dict[str, Any]]] = {}
    for mode in ("auto", "off"):
        async with Orchestrator(config_for(make_config, mode)) as orch:
            sess = orch.session("agent:a:same")
            results[mode] = [await outputs(sess, c, timeout_s=2 if c.startswith("sleep") else 60) for c in COMMANDS]
            box: Any = await sess.sandbox()
            assert box.backend.agents.started == (1 if mode == "auto" else 0)
            path = await box.backend.agents.exec_path(box.spec, box.id)
            assert path.kind == ("agent" if mode == "auto" else "docker exec")
    assert results["auto"] == results["off"]
    assert results["auto"][0]["exit_code"] == 3 and results["auto"][3]["exit_code"] == 137
    assert results["auto"][6]["error"] == "TIMEOUT" and results["auto"][3]["error"] == "KILLED"


# run in the sandbox by its own Python: what the image's agent.pyc was compiled from
PYC_CHECK = """
import hashlib, importlib.util, sys
d = "/usr/local/lib/sandbox-agent/"
src, pyc = open(d + "agent.py", "rb").read(), open(d + "agent.pyc", "rb").read()
print(pyc[:4] == importlib.util.MAGIC_NUMBER, int.from_bytes(pyc[4:8], "little"),
      pyc[8:16] == importlib.util.source_hash(src), hashlib.sha256(src).hexdigest())
"""


async def test_the_agent_runs_compiled_from_this_repository_s_source(make_config: Any) -> None:
    """The agent runs from the image's agent.pyc (compiling the source at every start costs each
    agent about 2 MiB more), and that file was compiled from images/sandbox/sandbox_agent.py as it
    is here: its header carries the hash of the source it came from."""
    source = (Path(__file__).resolve().parent.parent / "images" / "sandbox" / "sandbox_agent.py").read_bytes()
    async with Orchestrator(config_for(make_config)) as orch:
        sess = orch.session("agent:a:compiled")
        cmdline = str((await outputs(sess, "tr '\\0' ' ' < /proc/$PPID/cmdline"))["stdout"]).split()
        assert cmdline[:4] == ["/usr/bin/python3", "-I", "-S", "/usr/local/lib/sandbox-agent/agent.pyc"]
        checked = await outputs(sess, f"python3 -I -S -c '{PYC_CHECK}'")
        # its magic is this Python's, its flags say a checked hash (0b11), and the hash is the source's
        magic, flags, same_source, sha = str(checked["stdout"]).split()
        assert (magic, flags, same_source) == ("True", "3", "True"), checked
        assert sha == hashlib.sha256(source).hexdigest()  # the image's source is this repository's


async def agent_pids(sess: Any) -> list[str]:
    # the agent is each command's parent: $PPID of the wrapping shell
    out = await outputs(sess, "echo $PPID")
    return str(out["stdout"]).split()


# where the agent (the command's parent) writes its frames: the FIFO of its link (the unlinked
# `<token>.up`), else its stdout, the engine's exec stream
FRAMES_OUT = 'out=/proc/$PPID/fd/1; for f in /proc/$PPID/fd/*; do case "$(readlink $f)" in *.up*) out=$f;; esac; done'


@pytest.mark.parametrize(
    ("attack", "words"),
    [
        ("kill -9 $PPID", "stream ended"),
        (f"{FRAMES_OUT}; printf 'garbage-garbage-garbage' > $out", "over the limits"),
        # a header announcing a 1 GiB payload: refused from the 8 header bytes, nothing waited for
        (f"{FRAMES_OUT}; printf '\\000\\000\\000\\020\\100\\000\\000\\000' > $out", "over the limits"),
        # a well-formed frame that is not in the protocol
        (
            f'{FRAMES_OUT}; printf \'\\000\\000\\000\\022\\000\\000\\000\\000{{"t":"boom","id":1}}\' > $out',
            "not in the protocol",
        ),
    ],
    ids=["killed", "garbage", "gigabyte-frame", "forged-frame"],
)
async def test_an_agent_attacked_from_its_sandbox_costs_only_that_call(
    make_config: Any, attack: str, words: str
) -> None:
    """The sandbox user kills the agent or writes into its stream mid-call: the call fails with
    SANDBOX_UNAVAILABLE naming what happened, its command is stopped, the sandbox stays, and the
    next call gets a fresh agent."""
    async with Orchestrator(config_for(make_config)) as orch:
        sess = orch.session("agent:a:attacked")
        first = await agent_pids(sess)
        box: Any = await sess.sandbox()
        with anyio.fail_after(HANG_GUARD_S):
            result = await sess.call("exec", {"command": f"{attack}; sleep 171", "timeout_s": 600})
        assert result.error is not None and result.error.code == "SANDBOX_UNAVAILABLE", result
        assert "agent" in result.error.message and words in result.error.message, result.error.message
        after = await outputs(sess, "ps -eo args | grep -c '^sleep 171' || true; echo $PPID")
        left, new_agent = str(after["stdout"]).split()
        assert left == "0"  # the attacked call's command was stopped
        assert new_agent != first[0]
        again: Any = await sess.sandbox()
        assert again.id == box.id  # the sandbox was kept
        assert box.backend.agents.started == 2


async def test_a_stopped_agent_is_found_out_and_replaced(make_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox user SIGSTOPs the agent: the call that did it times out, the agent's silence is
    noticed then, the stopped agent is killed, and the next call runs on a new one."""
    monkeypatch.setattr(agent_link, "ANSWER_TIMEOUT_S", 2.0)
    async with Orchestrator(config_for(make_config)) as orch:
        sess = orch.session("agent:a:stopped")
        (first,) = await agent_pids(sess)
        with anyio.fail_after(HANG_GUARD_S):
            stopped = await outputs(sess, "kill -STOP $PPID; sleep 60", timeout_s=2)
        assert stopped["error"] == "TIMEOUT"
        box: Any = await sess.sandbox()
        link = await box.backend.agents.link(box.id, box.spec, None)
        assert link is not None and str(link.agent_pid) != first
        listing = await outputs(sess, f"ps -o stat= -p {first} || echo gone")
        assert str(listing["stdout"]).strip() == "gone"


async def test_sandboxes_removed_by_another_process_leave_no_open_links(
    make_config: Any, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI prune or a replica removes a container this service linked to and will never ask
    for again: its idle link's socket and pipes are let go at the next look (every 30 s)."""
    from sandbox.runtime.agent import resident

    clock = [1000.0]
    monkeypatch.setattr(resident, "clock", lambda: clock[0])
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: session}}}")
    async with Orchestrator(config) as orch:
        keeper = orch.session("agent:main:keeper")
        assert (await keeper.call("exec", {"command": "true"})).ok
        agents = orch.manager.backend.agents  # type: ignore[attr-defined]  # the Docker backend's
        names, links = [], []
        for i in range(4):
            sess = orch.session(f"agent:main:gone-{i}")
            assert (await sess.call("exec", {"command": "true"})).ok
            box = await sess.sandbox()
            assert box is not None
            names.append(box.spec.name)
            links += [link for (container, _), link in agents._links.items() if container == box.id]
        assert len(links) == 4 and all(link.dead is None for link in links)
        for name in names:  # removed elsewhere: this orchestrator is not told
            docker_client.containers.get(name).remove(force=True)
        with anyio.fail_after(HANG_GUARD_S):
            while len(agents._links) > 1:  # the engine ends the streams as it removes the containers
                clock[0] += resident.SWEEP_EVERY_S
                assert (await keeper.call("exec", {"command": "true"})).ok
                await anyio.sleep(0.2)
        assert all(link.dead for link in links)  # ended: each closed its transport (AgentLink._fail)


async def test_each_session_user_gets_its_own_agent(make_config: Any) -> None:
    """Sessions that run as uids of their own never share an agent (one could not signal the other's)."""
    config = make_config("""
agents:
  defaults: {sandbox: {mode: all, scope: agent, session_users: true}}
  list: [{id: a}]
""")
    async with Orchestrator(config) as orch:
        one, two = orch.session("agent:a:one"), orch.session("agent:a:two")
        out_one = await outputs(one, "id -u; echo $PPID; ps -o user= -p $PPID")
        out_two = await outputs(two, "id -u; echo $PPID; ps -o user= -p $PPID")
        uid_one, agent_one, owner_one = str(out_one["stdout"]).split()
        uid_two, agent_two, owner_two = str(out_two["stdout"]).split()
        assert uid_one != uid_two and agent_one != agent_two
        assert (owner_one, owner_two) == (uid_one, uid_two)
        # session two cannot reach session one's agent stream
        poke = await outputs(two, f"printf x > /proc/{agent_one}/fd/1 2>&1; echo rc=$?")
        assert "rc=0" not in str(poke["stdout"]), poke
        assert (await outputs(one, "echo still-fine"))["stdout"] == "still-fine\n"


@pytest.fixture
def odd_images(docker_client: Any, run_id: str) -> Iterator[dict[str, str]]:
    """Images from the exec image that claim an agent they cannot run, or an old protocol."""
    tags = {
        "broken": f"sandbox-exec-noagent:{run_id}",
        "old": f"sandbox-exec-oldagent:{run_id}",
    }
    dockerfiles = {
        "broken": "FROM sandbox-exec:latest\nUSER 0\nRUN rm /usr/local/lib/sandbox-agent/agent.py*\nUSER 1000:1000\n",
        "old": 'FROM sandbox-exec:latest\nLABEL io.agent-sandbox.resident-agent-protocol="0"\n',
    }
    for kind, tag in tags.items():
        docker_client.images.build(fileobj=io.BytesIO(dockerfiles[kind].encode()), tag=tag, rm=True)
    yield tags
    for tag in tags.values():
        docker_client.images.remove(tag, force=True)


async def test_images_without_a_working_agent_fall_back_to_docker_exec(make_config: Any, odd_images: Any) -> None:
    for kind, tag in odd_images.items():
        async with Orchestrator(config_for(make_config, image=tag)) as orch:
            sess = orch.session(f"agent:a:{kind}")
            out = await outputs(sess, "echo works; exit 4")
            assert (out["stdout"], out["exit_code"]) == ("works\n", 4)
            box: Any = await sess.sandbox()
            path = await box.backend.agents.exec_path(box.spec, box.id)
            assert path.kind == "docker exec"
            assert ("could not start" if kind == "broken" else "rebuild") in path.reason, path
            assert box.backend.agents.started == 0


async def test_explain_and_the_health_check_name_the_agent(
    make_config: Any, docker_client: Any, tmp_path: Path, instance: str
) -> None:
    """explain says which path a sandbox uses. By default Docker runs no health check on a sandbox
    (no exec a minute each: the agent's own traffic is its health); with
    `docker.health_interval_s` the image's check (the agent's `--health`) runs at that interval,
    and it passes."""
    for mode, expected in (
        ("auto", "agent (resident agent /usr/local/lib/sandbox-agent/agent.pyc)"),
        ("off", "docker exec (docker.agent is off)"),
    ):
        path = tmp_path / f"{mode}.yaml"
        path.write_text(
            f"state_dir: {tmp_path}/state-{mode}\ninstance: {instance}\n"
            f"agents: {{defaults: {{sandbox: {{mode: all, docker: {{agent: {mode}}}}}}}}}\n"
        )
        shown = run_cli("explain", "--session", "agent:main:x", "--json", config=path)
        assert json.loads(shown.stdout)["container"]["exec_path"] == expected
        assert f"exec       {expected}" in run_cli("explain", "--session", "agent:main:x", config=path).stdout
    async with Orchestrator(config_for(make_config)) as orch:
        box: Any = await orch.session("agent:a:quiet").sandbox()
        container = docker_client.containers.get(box.id)
        assert container.attrs["Config"]["Healthcheck"]["Test"] == ["NONE"]
        assert "Health" not in container.attrs["State"]  # nothing runs, nothing is reported
    checked = make_config(
        "agents: {defaults: {sandbox: {mode: all, docker: {health_interval_s: 60}}}, list: [{id: a}]}"
    )
    async with Orchestrator(checked) as orch:
        box = await orch.session("agent:a:health").sandbox()
        container = docker_client.containers.get(box.id)
        health = container.attrs["Config"]["Healthcheck"]
        assert health["Test"][-1] == "--health" and health["Test"][-2].endswith("/agent.pyc")  # the image's own
        assert health["Interval"] == 60 * 1_000_000_000
        assert container.exec_run(health["Test"][1:], user="1000").exit_code == 0


async def test_the_agent_runs_under_gvisor(make_config: Any, docker_client: Any) -> None:
    """With `docker.runtime: runsc` commands go through the agent too, inside gVisor's kernel, and
    an agent killed by the sandbox costs only that call there as well."""
    if "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("the engine has no runsc runtime (scripts/runsc installs and registers it)")
    config = make_config("""
agents:
  defaults: {sandbox: {mode: all, scope: agent, docker: {runtime: runsc}}}
  list: [{id: a}]
""")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:gvisor")
        assert (await outputs(sess, "uname -r"))["stdout"] == "4.4.0\n"  # gVisor's kernel
        box: Any = await sess.sandbox()
        assert (await box.backend.agents.exec_path(box.spec, box.id)).kind == "agent"
        assert box.backend.agents.started == 1
        killed = await sess.call("exec", {"command": "kill -9 $PPID; sleep 171", "timeout_s": 600})
        assert killed.error is not None and killed.error.code == "SANDBOX_UNAVAILABLE", killed
        assert (await outputs(sess, "ps -eo args | grep -c '^sleep 171' || true"))["stdout"] == "0\n"
        assert box.backend.agents.started == 2


def test_the_host_side_kill_refuses_a_pid_outside_its_container(docker_client: Any) -> None:
    """kill_exec signals only a running exec's pid that the engine lists for *that* container and
    whose cgroup is that container's: asked to kill container B's exec in A's name, or an exec
    that has ended, it signals nothing; asked for B's own, it kills exactly that process."""
    import time

    from sandbox.runtime.docker.kill import in_container, kill_exec
    from tests.conftest import RUN_ID, TEST_LABEL

    api = docker_client.api
    made = [
        docker_client.containers.run(
            "sandbox-exec:latest", ["sleep", "120"], detach=True, network_mode="none", labels={TEST_LABEL: RUN_ID}
        )
        for _ in range(2)
    ]
    a, b = made
    try:
        running = api.exec_create(b.id, ["sleep", "171"])["Id"]
        api.exec_start(running, detach=True)
        ended = api.exec_create(b.id, ["true"])["Id"]
        api.exec_start(ended)
        deadline = time.monotonic() + 10
        while not api.exec_inspect(running).get("Running") and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(api.exec_inspect(running)["Pid"])
        assert pid > 1 and in_container(pid, b.id) and not in_container(pid, a.id)

        assert kill_exec(api, a.id, running) is False  # B's process in A's name: refused
        assert kill_exec(api, b.id, ended) is False  # ended: its pid may be someone else's now
        assert "sleep 171" in str(api.top(b.id))
        assert kill_exec(api, b.id, running) is True
        deadline = time.monotonic() + 10
        while "sleep 171" in str(api.top(b.id)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "sleep 171" not in str(api.top(b.id))
        assert "sleep 120" in str(api.top(b.id))  # only that process
    finally:
        for container in made:
            container.remove(force=True)
