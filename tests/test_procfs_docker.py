"""Sessions sharing a container cannot read each other's command lines (issue 24, item 8), as
attacks against the real engine.

Alice starts a background command whose command line carries a marker; Bob, another session of
the same agent (another session uid), lists `/proc`, reads every `cmdline`, runs `ps aux` and
opens Alice's pid directly: he finds neither her command line nor her pid. Alice still lists and
kills her own. The option is set on that container's procfs only: the host's `/proc` and another
container's are untouched. Under `session_users: off` (one uid, one trust domain) Bob sees it.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.runtime.docker import procfs
from sandbox.runtime.docker.procfs import is_hidden, options_of_proc
from tests.conftest import RUN_ID, TEST_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

# the marker is spelled in two halves, so no searching command carries it whole on its own line
LOOK = r"""
p="$TMPDIR/pattern.$$"; printf '%s\n' "$M1$M2" > "$p"  # grep's own argv must not carry it
echo "uid $(id -u)"
echo "cmdline hits $(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | grep -c -f "$p")"
echo "ps hits $(ps auxww | grep -c -f "$p")"
echo "pgrep $(pgrep -f "$M1$M2" | tr '\n' ' ')"
ls /proc | grep -qx "$TARGET" && echo "PID LISTED" || echo "pid not listed"
cat "/proc/$TARGET/cmdline" >/dev/null 2>&1 && echo "CMDLINE READ" || echo "cmdline refused"
[ -e "/proc/$TARGET" ] && echo "PID OPENS" || echo "pid absent"
echo "proc $(grep ' /proc ' /proc/self/mountinfo)"
echo done
"""


def agent_config(make_config: Any, extra: str = "") -> Any:
    return make_config(f"agents: {{defaults: {{sandbox: {{mode: all, scope: agent{extra}}}}}}}")


async def start_marked(alice: Any) -> tuple[str, str, dict[str, str]]:
    """Alice's background command with a unique command line; (process id, its pid, the halves)."""
    half = secrets.token_hex(4)
    halves = {"M1": "marker-", "M2": f"SECRET-{half}"}
    started = await alice.call("exec", {"command": f"sleep 300 && echo marker-SECRET-{half}", "background": True})
    assert started.ok, started
    found = await alice.call("exec", {"command": 'pgrep -f "$M1$M2" | head -1', "env": halves})
    pid = found.output["output"].strip()
    assert found.ok and pid.isdigit(), found
    return started.output["process_id"], pid, halves


async def test_another_session_cannot_see_command_lines_or_pids(make_config: Any, docker_client: Any) -> None:
    """Bob finds neither Alice's command line nor her pid; Alice lists and kills her own."""
    async with Orchestrator(agent_config(make_config)) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        proc_id, pid, halves = await start_marked(alice)

        looked = await bob.call("exec", {"command": LOOK, "env": {**halves, "TARGET": pid}})
        out = looked.output["output"]
        assert looked.ok and out.rstrip().endswith("done"), looked
        assert "cmdline hits 0" in out and "ps hits 0" in out and "pgrep \n" in out, out
        assert "pid not listed" in out and "cmdline refused" in out and "pid absent" in out, out
        # the container's /proc: hidepid on its superblock, its mount flags kept
        proc_line = next(line for line in out.splitlines() if line.startswith("proc "))
        assert "hidepid=invisible" in proc_line and "nosuid,nodev,noexec" in proc_line, proc_line

        # Alice sees and kills her own
        own = await alice.call("exec", {"command": LOOK, "env": {**halves, "TARGET": pid}})
        mine = own.output["output"]
        assert "PID LISTED" in mine and "CMDLINE READ" in mine and "cmdline hits 0" not in mine, mine
        listed = await alice.call("process", {"action": "list"})
        assert listed.ok and proc_id in str(listed.output), listed
        killed = await alice.call("process", {"action": "kill", "id": proc_id})
        assert killed.ok, killed
        polled = await alice.call("process", {"action": "poll", "id": proc_id})
        assert polled.output["status"] in ("killed", "exited"), polled
        gone = await alice.call("exec", {"command": 'pgrep -f "$M1$M2" || echo none', "env": halves})
        assert gone.output["output"].strip() == "none", gone
        # and signals her own from inside (what the in-container kill does), Bob cannot
        _, again, halves = await start_marked(alice)
        refused = await bob.call("exec", {"command": f"kill -9 {again} 2>/dev/null && echo KILLED || echo refused"})
        assert refused.output["output"].strip() == "refused", refused
        own_kill = await alice.call("exec", {"command": 'pkill -f "$M1$M2" && echo killed', "env": halves})
        assert own_kill.output["output"].strip() == "killed", own_kill

        # only that container's procfs: the host's and another container's are untouched
        assert not is_hidden(options_of_proc(Path("/proc/self/mountinfo").read_text()) or "")
        box = await alice.sandbox()
        assert is_hidden(procfs.proc_options(docker_client.api.inspect_container(box.id)["State"]["Pid"]) or "")
        other = docker_client.containers.run(
            "sandbox-exec:latest", ["sleep", "60"], detach=True, user="1000:1000", labels={TEST_LABEL: RUN_ID}
        )
        try:
            other.reload()
            assert not is_hidden(procfs.proc_options(other.attrs["State"]["Pid"]) or "")
        finally:
            other.remove(force=True)


async def test_a_single_session_container_is_left_as_it_was(make_config: Any) -> None:
    """Where no sessions share the container (scope: session), its /proc is not changed."""
    async with Orchestrator(make_config("agents: {defaults: {sandbox: {mode: all, scope: session}}}")) as orch:
        sess = orch.session("agent:main:alice")
        shown = await sess.call("exec", {"command": "grep ' /proc ' /proc/self/mountinfo"})
        assert shown.ok and "hidepid" not in shown.output["output"], shown


async def test_control_one_uid_sees_everything(make_config: Any) -> None:
    """The control: with `session_users: off` (one uid, one trust domain) Bob reads Alice's command line."""
    async with Orchestrator(agent_config(make_config, ", session_users: off")) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        proc_id, pid, halves = await start_marked(alice)
        looked = await bob.call("exec", {"command": LOOK, "env": {**halves, "TARGET": pid}})
        out = looked.output["output"]
        assert "PID LISTED" in out and "CMDLINE READ" in out and "cmdline hits 0" not in out, out
        await alice.call("process", {"action": "kill", "id": proc_id})


async def test_a_restarted_container_is_hidden_again_when_adopted(make_config: Any, docker_client: Any) -> None:
    """A container whose /proc lost the option (restarted by hand, or made before it existed) gets
    it back when the orchestrator adopts it, before a session runs anything in it."""
    config = agent_config(make_config)
    async with Orchestrator(config) as orch:
        assert (await orch.session("agent:main:alice").call("exec", {"command": "true"})).ok
        box = await orch.session("agent:main:alice").sandbox()
        container_id = box.id
    docker_client.api.restart(container_id, timeout=1)
    pid = docker_client.api.inspect_container(container_id)["State"]["Pid"]
    assert not is_hidden(procfs.proc_options(pid) or "")
    async with Orchestrator(config) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        _, alice_pid, halves = await start_marked(alice)
        assert (await alice.sandbox()).id == container_id
        looked = await bob.call("exec", {"command": LOOK, "env": {**halves, "TARGET": alice_pid}})
        assert "pid not listed" in looked.output["output"] and "cmdline hits 0" in looked.output["output"], looked


def test_doctor_says_whether_processes_can_be_hidden(docker_client: Any) -> None:
    """`sandbox doctor`'s probe sets the option on a throwaway container here (root, local engine)."""
    status, name, detail, _ = procfs.probe(docker_client, "sandbox-exec:latest")
    assert (status, name) == ("ok", "process hiding"), detail


def test_on_runsc_the_gap_is_reported_not_hidden(docker_client: Any) -> None:
    """gVisor's /proc is its own and has no hidepid: applying reports why, it does not pretend."""
    if "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("the engine has no runsc runtime (scripts/runsc installs and registers it)")
    container = docker_client.containers.run(
        "sandbox-exec:latest",
        ["sleep", "60"],
        detach=True,
        runtime="runsc",
        user="1000:1000",
        cap_drop=["ALL"],
        labels={TEST_LABEL: RUN_ID},
    )
    try:
        container.reload()
        hiding = procfs.apply(int(container.attrs["State"]["Pid"]), container.id)
        assert not hiding.applied and "gVisor" in hiding.reason, hiding
    finally:
        container.remove(force=True)


async def test_on_runsc_sessions_still_see_each_other_as_documented(make_config: Any, docker_client: Any) -> None:
    """The documented limit: under gVisor (no hidepid) Bob still reads Alice's command line; the
    sandbox is made all the same, its gap logged and shown by doctor."""
    if "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("the engine has no runsc runtime (scripts/runsc installs and registers it)")
    async with Orchestrator(agent_config(make_config, ", docker: {runtime: runsc}")) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        proc_id, pid, halves = await start_marked(alice)
        looked = await bob.call("exec", {"command": LOOK, "env": {**halves, "TARGET": pid}})
        assert "CMDLINE READ" in looked.output["output"], looked
        await alice.call("process", {"action": "kill", "id": proc_id})
