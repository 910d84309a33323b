"""`workspace_store: volume`: the workspace is a Docker volume the host cannot see, reached by the
file tools through the sandbox's resident agent. The link, swap-race and hardlink attacks of the
host-side workspace, run against this path; the decoy lives in the container, outside /workspace."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.errors import ConfigError
from sandbox.runtime.naming import Labels
from sandbox.runtime.workspace_ref import Volume
from tests.call_helpers import writes_during_a_swap_race
from tests.test_tools_docker import ATTACKS

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

DECOY = "/tmp/decoy"  # outside the workspace, writable by the sandbox user: what a followed link would reach


def volume_config(make_config: Any, scope: str = "session") -> Any:
    return make_config(f"agents: {{defaults: {{sandbox: {{mode: all, scope: {scope}, workspace_store: volume}}}}}}")


async def sh(sess: Any, command: str) -> str:
    result = await sess.call("exec", {"command": command})
    assert result.ok, result
    return str(result.output["output"])


async def test_file_tools_and_commands_share_the_volume(make_config: Any, docker_client: Any) -> None:
    async with Orchestrator(volume_config(make_config)) as orch:
        sess = orch.session("agent:main:vol")
        wrote = await sess.call("write", {"path": "src/app.py", "content": "print('hi')\n"})
        assert wrote.ok, wrote
        assert await sh(sess, "python3 src/app.py; stat -c '%U %a' src/app.py") == "hi\nsandbox 644\n"
        await sh(sess, "echo from-exec > made.txt")
        read = await sess.call("read", {"path": "made.txt"})
        assert read.ok and read.output["content"] == "from-exec\n"
        edited = await sess.call("edit", {"path": "src/app.py", "old_string": "hi", "new_string": "bye"})
        patched = await sess.call(
            "apply_patch", {"input": "*** Begin Patch\n*** Add File: notes.md\n+patched\n*** End Patch\n"}
        )
        assert edited.ok and patched.ok, (edited, patched)
        assert await sh(sess, "python3 src/app.py; cat notes.md") == "bye\npatched\n"
        # a conflict is still a conflict: the file changed since this session read it
        await sess.call("read", {"path": "made.txt"})
        await sh(sess, "echo changed > made.txt")
        conflict = await sess.call("edit", {"path": "made.txt", "old_string": "changed", "new_string": "x"})
        assert conflict.error is not None and conflict.error.code == "CONFLICT", conflict
        box: Any = await sess.sandbox()
        (mount,) = [m for m in docker_client.containers.get(box.id).attrs["Mounts"] if m["Destination"] == "/workspace"]
        assert mount["Type"] == "volume" and mount["Name"] == box.spec.mounts[0].source
        volume = docker_client.volumes.get(mount["Name"])
        assert volume.attrs["Labels"][Labels.SCOPE_KEY] == "agent:main:vol"
        assert box.spec.workspace == Volume(mount["Name"])  # no host folder: nothing of it is on this host's paths
        # the volume outlives its container, like a scratch folder does
        await orch.manager.close_session(sess.agent, "agent:main:vol")
        again = orch.session("agent:main:vol")
        assert (await again.call("read", {"path": "notes.md"})).output["content"] == "patched\n"


async def test_planted_links_are_never_followed(make_config: Any) -> None:
    """Links to a file, a folder and `/` outside the workspace, and through a parent: every file
    tool refuses each, and the decoy outside is untouched."""
    async with Orchestrator(volume_config(make_config)) as orch:
        sess = orch.session("agent:main:links")
        plant = (
            f"mkdir -p {DECOY} && echo DECOY > {DECOY}/decoy.txt && ln -s {DECOY}/decoy.txt flink && "
            f"ln -s {DECOY} dlink && ln -s / d && mkdir -p real && ln -s {DECOY} real/parent && echo planted"
        )
        assert "planted" in await sh(sess, plant)
        attempts = 0
        for link in ("flink", "dlink", "d", "real/parent", "d/tmp/decoy"):
            for tool, make in ATTACKS:
                args = make(link)
                r = await sess.call(tool, args)
                attempts += 1
                assert not r.ok, (tool, args, r.output)
                assert r.error.code in ("PERMISSION_DENIED", "FILE_NOT_FOUND", "INVALID_ARGUMENTS"), (
                    tool,
                    args,
                    r.error,
                )
        assert attempts == 45
        assert await sh(sess, f"ls {DECOY}; cat {DECOY}/decoy.txt") == "decoy.txt\nDECOY\n"


async def test_a_folder_swapped_for_a_link_mid_write_never_lands_outside(make_config: Any) -> None:
    async with Orchestrator(volume_config(make_config)) as orch:
        sess = orch.session("agent:main:race")
        await sh(sess, f"mkdir -p {DECOY}")
        swaps, outcomes = await writes_during_a_swap_race(sess, DECOY)
        assert swaps > 10 and sum(outcomes.values()) >= 60, (swaps, outcomes)  # the race really ran
        assert await sh(sess, f"sleep 3; ls -A {DECOY} | wc -l") == "0\n", outcomes
        assert outcomes.get("PERMISSION_DENIED", 0) > 0 or outcomes.get("ok", 0) > 0


async def test_hard_links_cannot_reach_out_and_writes_never_go_through_them(make_config: Any) -> None:
    """A hard link to a file outside the workspace cannot be made (another mount); a write to a
    name that shares its file with another replaces that name only (temp file + rename)."""
    async with Orchestrator(volume_config(make_config)) as orch:
        sess = orch.session("agent:main:hard")
        out = await sh(
            sess,
            f"mkdir -p {DECOY} && echo DECOY > {DECOY}/x && ln {DECOY}/x outside 2>&1 | grep -c 'cross-device\\|Invalid'",
        )
        assert out.strip() == "1"
        await sh(sess, "echo ORIGINAL > a.txt && ln a.txt twin")
        assert (await sess.call("write", {"path": "twin", "content": "NEW\n"})).ok
        assert await sh(sess, "cat a.txt twin; stat -c %h a.txt") == "ORIGINAL\nNEW\n1\n"


async def test_a_volume_holds_scratch_workspaces_only(make_config: Any) -> None:
    with pytest.raises(ConfigError) as info:
        make_config("agents: {defaults: {sandbox: {mode: all, workspace_store: volume, workspace_access: rw}}}")
    assert "agents.defaults.sandbox.workspace_store" in str(info.value) and "workspace_access" in str(info.value)


async def test_sessions_with_uids_of_their_own_share_the_volume_through_the_group(make_config: Any) -> None:
    """Agent scope: each session runs as a uid of its own, and its file tools go through its own
    agent; the workspace is shared through the sandbox user's group, as a host scratch folder is."""
    async with Orchestrator(volume_config(make_config, scope="agent")) as orch:
        one, two = orch.session("agent:main:one"), orch.session("agent:main:two")
        assert (await one.call("write", {"path": "shared/plan.md", "content": "step 1\n"})).ok
        edited = await two.call("edit", {"path": "shared/plan.md", "old_string": "step 1", "new_string": "step 2"})
        assert edited.ok, edited
        uids = {await sh(s, "id -u") for s in (one, two)}
        assert len(uids) == 2
        assert await sh(one, "cat shared/plan.md; stat -c '%a %G' shared shared/plan.md") == (
            "step 2\n2775 sandbox\n664 sandbox\n"
        )


@pytest.mark.parametrize("store", ["volume", "host"])
async def test_the_quota_is_measured_on_the_volume_from_the_host(make_config: Any, store: str) -> None:
    """workspace_quota holds on a volume too, measured host-side on the engine's folder of it
    (never by asking the agent, which the sandbox could make lie): a write past it is refused,
    and a command writing past it at once (before any measurement beside it) is stopped; the
    same on a host folder."""
    config = make_config(
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: session, workspace_store: {store}, workspace_quota: 1m}}}}}}"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:quota")
        big = await sess.call("write", {"path": "big.txt", "content": "x" * (2 << 20)})
        assert big.error is not None and big.error.code == "QUOTA_EXCEEDED", big
        assert ("the workspace volume" if store == "volume" else "the workspace") in big.error.message
        flood = await sess.call("exec", {"command": "head -c 50000000 /dev/zero > flood; sleep 20", "timeout_s": 60})
        assert flood.error is not None and flood.error.code == "QUOTA_EXCEEDED", flood
        await sh(sess, "rm -f flood")  # room again: a small write fits (measured afresh)
        small = await sess.call("write", {"path": "small.txt", "content": "fits\n"})
        assert small.ok, small
