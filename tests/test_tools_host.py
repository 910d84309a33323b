"""The same tools on the host (mode off): same results, same refusals, same kill on timeout."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator

pytestmark = pytest.mark.anyio


@pytest.fixture
def host_config(make_config: Any, tmp_path: Path) -> Any:
    ws = tmp_path / "ws"
    ws.mkdir()
    return make_config(f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}")


async def test_file_tools_and_exec_on_host(host_config: Any, tmp_path: Path) -> None:
    """write, read, edit, apply_patch and exec work in the host workspace."""
    ws = tmp_path / "ws"
    async with Orchestrator(host_config) as orch:
        sess = orch.session("agent:a:main")
        assert not sess.sandboxed
        assert (await sess.call("write", {"path": "a/f.txt", "content": "one\n"})).ok
        assert (await sess.call("edit", {"path": "a/f.txt", "old_string": "one", "new_string": "two"})).ok
        patch = "*** Begin Patch\n*** Update File: a/f.txt\n@@\n-two\n+three\n*** End Patch\n"
        assert (await sess.call("apply_patch", {"input": patch})).ok
        read = await sess.call("read", {"path": f"{ws}/a/f.txt"})
        assert read.output["content"] == "three\n"
        out = await sess.call("exec", {"command": "cat a/f.txt; pwd", "workdir": "."})
        assert out.output["output"] == f"three\n{ws}\n"
        outside = await sess.call("exec", {"command": "pwd", "workdir": "../.."})
        assert outside.error.code == "PERMISSION_DENIED"


async def test_host_symlink_and_traversal_refused(host_config: Any, tmp_path: Path) -> None:
    """On the host too, links out of the workspace and traversal are refused."""
    ws = tmp_path / "ws"
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("DECOY\n")
    os.symlink(decoy, ws / "link")
    async with Orchestrator(host_config) as orch:
        sess = orch.session("agent:a:main")
        for tool, args in (
            ("read", {"path": "link"}),
            ("edit", {"path": "link", "old_string": "D", "new_string": "X"}),
            ("read", {"path": "../decoy.txt"}),
            ("write", {"path": str(decoy), "content": "X"}),
        ):
            r = await sess.call(tool, args)
            assert r.error.code == "PERMISSION_DENIED", (tool, r.error)
    assert decoy.read_text() == "DECOY\n"


async def test_host_timeout_kills_process_group(host_config: Any) -> None:
    """A host command that times out is killed with everything it started."""
    async with Orchestrator(host_config) as orch:
        sess = orch.session("agent:a:main")
        r = await sess.call("exec", {"command": "sleep 987 & sleep 987", "timeout_s": 1})
        assert r.error.code == "TIMEOUT"
    left = subprocess.run(["pgrep", "-f", "sleep 98[7]"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


async def test_host_background_process(host_config: Any) -> None:
    """Background processes work on the host too."""
    import anyio

    async with Orchestrator(host_config) as orch:
        sess = orch.session("agent:a:main")
        start = await sess.call("exec", {"command": "echo bg-out", "background": True})
        with anyio.fail_after(10):  # poll until it ends (no timing assumption)
            while (polled := await sess.call("process", {"action": "poll", "id": start.output["process_id"]})).output[
                "status"
            ] == "running":
                await anyio.sleep(0.05)
        assert polled.output["status"] == "exited" and polled.output["output"] == "bg-out\n"


async def test_cancelled_call_kills_the_command(host_config: Any) -> None:
    """When the caller gives up (task cancelled), the command and its children are killed too."""
    import anyio

    async with Orchestrator(host_config) as orch:
        sess = orch.session("agent:a:main")
        with anyio.move_on_after(0.5):
            await sess.call("exec", {"command": "sleep 979 & sleep 979"})
    # the kill ran (shielded) before the cancelled call returned; killed processes leave /proc
    # within moments: poll with a deadline rather than sleep a fixed time
    with anyio.fail_after(5):
        while subprocess.run(["pgrep", "-f", "sleep 97[9]"], capture_output=True, text=True).stdout.strip():
            await anyio.sleep(0.05)
