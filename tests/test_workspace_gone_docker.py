"""A sandbox whose workspace folder was removed on the host (issue 24, item 17): its bind holds a
dead folder, and every exec in it failed with "current working directory is outside of container
mount namespace root". The folder's inode, recorded as a label at creation, no longer matches, so
the sandbox is made again on a workspace made again, whether the process still holds the sandbox
or adopts it afresh."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.runtime.docker.workspace import WORKSPACE_ID_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

SCOPES = ["session", "agent"]


def config_for(make_config: Any, scope: str) -> Any:
    return make_config(f"agents: {{defaults: {{sandbox: {{mode: all, scope: {scope}}}}}}}")


@pytest.mark.parametrize("scope", SCOPES)
async def test_exec_after_the_workspace_was_removed_runs_in_a_new_sandbox(
    make_config: Any, docker_client: Any, scope: str
) -> None:
    """rm -rf of the workspace folder between two calls: the second call works, in a new container
    on a new (empty) workspace folder; the old container is gone."""
    config = config_for(make_config, scope)
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:gone")
        first = await sess.call("exec", {"command": "echo before > kept.txt && pwd"})
        assert first.ok and first.output["output"].strip() == "/workspace", first
        spec = orch.manager.spec_for(sess.agent, "agent:main:gone")
        old = docker_client.containers.get(spec.name)
        assert old.labels.get(WORKSPACE_ID_LABEL), "the workspace's inode is recorded at creation"
        folder = Path(spec.mounts[0].source)
        shutil.rmtree(folder)

        again = await sess.call("exec", {"command": "ls -A; echo after > new.txt; echo ok"})
        assert again.ok, again
        assert again.output["output"].split() == ["ok"], again.output  # an empty workspace, usable
        assert "outside of container mount namespace root" not in str(again.output)
        new = docker_client.containers.get(spec.name)
        assert new.id != old.id
        assert (folder / "new.txt").read_text() == "after\n"
        files = await sess.call("read", {"path": "new.txt"})
        assert files.ok and "after" in str(files.output), files
    assert not docker_client.containers.list(all=True, filters={"id": old.id})


async def test_a_new_process_does_not_adopt_a_sandbox_on_a_removed_workspace(
    make_config: Any, docker_client: Any
) -> None:
    """The folder removed while no process held the sandbox: the next process's first call makes
    the sandbox again instead of adopting the one whose workspace is dead."""
    config = config_for(make_config, "agent")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:main")
        assert (await sess.call("exec", {"command": "true"})).ok
        spec = orch.manager.spec_for(sess.agent, "agent:main:main")
        old_id = docker_client.containers.get(spec.name).id
    before = os.stat(spec.mounts[0].source)
    shutil.rmtree(spec.mounts[0].source)
    # made again by someone else meanwhile (another folder, same path and owner: the same config),
    # still not the folder the container holds
    Path(spec.mounts[0].source).mkdir(parents=True)
    os.chown(spec.mounts[0].source, before.st_uid, before.st_gid)
    os.chmod(spec.mounts[0].source, before.st_mode & 0o7777)
    async with Orchestrator(config) as orch:
        result = await orch.session("agent:main:main").call("exec", {"command": "echo hi > f && cat f"})
    assert result.ok and result.output["output"] == "hi\n", result
    assert docker_client.containers.get(spec.name).id != old_id
    assert (Path(spec.mounts[0].source) / "f").read_text() == "hi\n"
