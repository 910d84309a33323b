"""Closing a session that shares a container (session users): what it left running goes with it.

A session with a uid of its own can start processes that outlive its calls (`setsid ... &`).
Left alone they would go on after the session is closed: holding the container's pids limit
(the other sessions then cannot start anything), burning its CPU, writing to the workspace the
agent's sessions share. The attack here fills the pids limit, shows that it works, then closes
the session and checks that the engine lists nothing of its uid and that the others run again.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.runtime.docker import kill as docker_kill

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

# detached from the call (a session and process group of their own, no tag kept by `env -i`)
ESCAPE = "for i in $(seq {n}); do setsid env -i /bin/sleep 300 </dev/null >/dev/null 2>&1 & done; sleep 0.3"
PROBE = "/bin/echo still-here"  # not the shell's builtin: a process of its own
WRITER = "setsid env -i /bin/sh -c 'while :; do date >> /workspace/after-close.log; sleep 0.2; done' </dev/null >/dev/null 2>&1 &"


def shared_config(make_config: Any, pids: int = 256) -> Any:
    return make_config(
        "agents: {defaults: {sandbox: {mode: all, scope: agent, session_users: on, "
        f"docker: {{pids_limit: {pids}}}}}}}, list: [{{id: a}}]}}"
    )


def uids_running(docker_client: Any, container_id: str) -> list[int]:
    """The uids of every process the engine lists in the container (numbers, from ps)."""
    top = docker_client.api.top(container_id, ps_args="-o uid,pid")
    column = top["Titles"].index("UID")
    return [int(row[column]) for row in top["Processes"]]


def pids_running(docker_client: Any, container_id: str) -> list[int]:
    """The host pids of every process the engine lists in the container."""
    top = docker_client.api.top(container_id, ps_args="-o pid")
    column = top["Titles"].index("PID")
    return [int(row[column]) for row in top["Processes"]]


async def uid_of(sess: Any) -> int:
    found = await sess.call("exec", {"command": "id -u"})
    assert found.ok and found.output["exit_code"] == 0, found
    return int(found.output["output"])


async def test_a_closed_session_leaves_nothing_running_and_frees_the_pids_limit(
    make_config: Any, docker_client: Any
) -> None:
    async with Orchestrator(shared_config(make_config, pids=32)) as orch:
        attacker, other = orch.session("agent:a:attacker"), orch.session("agent:a:other")
        attacker_uid, other_uid = await uid_of(attacker), await uid_of(other)
        assert attacker_uid != other_uid
        box: Any = await other.sandbox()
        await attacker.call("exec", {"command": ESCAPE.format(n=40)})  # fails once the limit is full
        assert uids_running(docker_client, box.id).count(attacker_uid) >= 20
        # the attack works: with the attacker's call over one pid is free, for the other's shell,
        # and the command the shell starts finds none
        blocked = await other.call("exec", {"command": PROBE})
        assert "still-here" not in str(blocked.output), blocked

        assert await attacker.close() == ["agent:a:attacker"]
        assert attacker_uid not in uids_running(docker_client, box.id)
        back = await other.call("exec", {"command": PROBE})
        assert back.ok and back.output["output"] == "still-here\n", back
        assert other_uid in uids_running(docker_client, box.id)  # the other session's agent stays


async def test_a_closed_session_s_processes_are_killed_from_inside_when_the_host_cannot_see_them(
    make_config: Any, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote engine (its processes not on this host: the fault made here) still loses them:
    `kill -9 -1` as the session's uid, in the sandbox."""
    monkeypatch.setattr(docker_kill, "kill_user", lambda *_: None)
    async with Orchestrator(shared_config(make_config)) as orch:
        leaver, other = orch.session("agent:a:leaver"), orch.session("agent:a:other")
        leaver_uid = await uid_of(leaver)
        box: Any = await other.sandbox()
        await leaver.call("exec", {"command": ESCAPE.format(n=3) + "; " + WRITER})
        assert uids_running(docker_client, box.id).count(leaver_uid) >= 4
        started = box.backend.agents.started
        view = await leaver.own_uid_view()
        assert view is not None and view.session_user.uid == leaver_uid
        assert await view.end_processes() is True  # said so only once `kill -0 -1` finds nothing
        await leaver.close()
        assert leaver_uid not in uids_running(docker_client, box.id)
        assert box.backend.agents.started == started  # plain docker exec: no agent started to be killed
        size = await other.call("exec", {"command": "wc -c < /workspace/after-close.log"})
        await anyio.sleep(1)
        again = await other.call("exec", {"command": "wc -c < /workspace/after-close.log"})
        assert size.output["output"] == again.output["output"], (size, again)  # nobody writes any more


async def test_root_and_the_sandbox_s_own_user_are_never_ended(make_config: Any, docker_client: Any) -> None:
    """end_user is for a session's own uid: asked for root or the sandbox's user (whose
    processes are the container's keep-alive and every session-less command), it refuses."""
    async with Orchestrator(shared_config(make_config)) as orch:
        box: Any = await orch.session("agent:a:one").sandbox()
        # the keep-alive may still be starting: what runs now must all run after
        before = set(pids_running(docker_client, box.id))
        for user in ("0", "0:0", box.spec.user, box.spec.user.partition(":")[0], "nobody"):
            with pytest.raises(ValueError, match="not a session's own user"):
                await box.end_user(user)
        assert before and before <= set(pids_running(docker_client, box.id))


async def test_closing_a_session_that_never_ran_there_makes_and_allocates_nothing(
    make_config: Any, docker_client: Any
) -> None:
    """A second orchestrator closing a session that never ran in the agent's container neither
    starts anything nor gives the session a uid (uids are never reused: the registry would grow)."""
    config = shared_config(make_config)
    async with Orchestrator(config) as orch:
        box: Any = await orch.session("agent:a:worker").sandbox()
        await orch.session("agent:a:worker").call("exec", {"command": "true"})
        registry = config.state_dir / "session-users"
        before = sorted(str(p) for p in registry.rglob("*"))
        # this test's own containers (other tests run beside it)
        ours = {"label": f"io.agent-sandbox.instance={orch.manager.instance}"}
        names = sorted(c.name for c in docker_client.containers.list(all=True, filters=ours))
        async with Orchestrator(config) as other:
            await other.session("agent:a:never").close()
        assert sorted(str(p) for p in registry.rglob("*")) == before
        assert sorted(c.name for c in docker_client.containers.list(all=True, filters=ours)) == names
        assert box.id in [c.id for c in docker_client.containers.list()]


@pytest.mark.parametrize("session_users", ["auto", "on"])
async def test_closing_a_session_on_the_host_backend_still_closes(make_config: Any, session_users: str) -> None:
    """The host backend runs every command as the orchestrator's user, whatever uid a session
    is given: there is nothing of the session's uid to end, and its close goes through."""
    config = make_config(
        "runtime: {backend: host}\n"
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: agent, session_users: {session_users}}}}}}}"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:one")
        assert (await sess.call("exec", {"command": "true"})).ok
        assert await sess.close() == ["agent:main:one"]
        assert await orch.session("agent:main:never").close() == ["agent:main:never"]


async def test_a_closed_session_s_background_process_files_leave_the_shared_tmp(
    make_config: Any, docker_client: Any
) -> None:
    """A background process keeps its output, exit and pid files on /tmp, which outlives the
    session in a shared container: they go with the session, the other session's stay."""
    async with Orchestrator(shared_config(make_config)) as orch:
        leaving, staying = orch.session("agent:a:leaving"), orch.session("agent:a:staying")
        started = {}
        for sess in (leaving, staying):
            bg = await sess.call("exec", {"command": "echo lots of output; sleep 300", "background": True})
            assert bg.ok, bg
            started[sess.key] = bg.output["process_id"]
        box = await staying.sandbox()
        assert box is not None

        uids = {sess.key: await uid_of(sess) for sess in (leaving, staying)}

        def files_of(key: str) -> list[str]:  # as the session's uid: its record folder is 0700, and root has no caps
            found = docker_client.containers.get(box.id).exec_run(
                ["sh", "-c", f"find /tmp -name '{started[key]}*' 2>/dev/null"], user=str(uids[key])
            )
            return str(found.output.decode()).split()

        assert files_of("agent:a:leaving") and files_of("agent:a:staying")
        leave = (
            "head -c 100000 /dev/zero > $TMPDIR/left-behind; echo mine > /tmp/direct-$(id -u);"
            " mkdir -p $TMPDIR/locked/deeper && touch $TMPDIR/locked/deeper/f && chmod 000 $TMPDIR/locked/deeper $TMPDIR/locked;"
            " ln -s /workspace $TMPDIR/to-workspace; echo $TMPDIR"
        )
        temp = await leaving.call("exec", {"command": leave})
        assert temp.ok, temp
        assert (await staying.call("exec", {"command": "echo theirs > /workspace/kept.txt"})).ok
        record_dir = temp.output["output"].strip().rsplit("/", 1)[0]  # its TMPDIR is inside it
        assert await leaving.close() == ["agent:a:leaving"]
        assert files_of("agent:a:leaving") == []
        assert files_of("agent:a:staying")
        # the whole record folder went, its TMPDIR with it (the shared /tmp is a 256m tmpfs)
        # (a folder it locked with chmod 000 too, and the file it made in /tmp itself; a link is
        # removed, never followed)
        listed = docker_client.containers.get(box.id).exec_run(["ls", "-a", "/tmp"], user=str(uids["agent:a:staying"]))
        names = listed.output.decode().split()
        assert record_dir.rsplit("/", 1)[1] not in names and f"direct-{uids['agent:a:leaving']}" not in names
        kept = await staying.call("read", {"path": "kept.txt"})
        assert kept.ok and "theirs" in kept.output["content"], kept
