"""One suite of tool behaviour, run against every way tools run: mode `off` (the host shell of an
unsandboxed session), the host backend (`runtime.backend: host`, no isolation) and the Docker
backend (the real engine). A new backend joins by adding a parameter; whatever only one backend
can promise (isolation, hardening, mounts) stays in its own tests."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator

pytestmark = pytest.mark.anyio

BACKENDS = [
    pytest.param("off", id="mode-off"),
    pytest.param("host", id="host"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
]


@pytest.fixture(params=BACKENDS)
def config(request: Any, make_config: Any, tmp_path: Path) -> Any:
    """A session-scoped config on the backend under test (images built for Docker)."""
    if request.param == "off":
        ws = tmp_path / "ws"
        ws.mkdir()
        return make_config(
            f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: main, workspace: '{ws}'}}]}}"
        )
    if request.param == "docker":
        request.getfixturevalue("images")
    return make_config(
        f"runtime: {{backend: {request.param}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_access: none}}}"
    )


async def test_exec_reports_output_exit_code_and_env(config: Any) -> None:
    """exec returns both streams' output, the exit code as data, and the env it was given.

    (Lines of one stream keep their order; across stdout and stderr the engine may reorder.)"""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:c1")
        ok = await sess.call("exec", {"command": 'echo "$GREETING"; echo err >&2', "env": {"GREETING": "hi"}})
        failed = await sess.call("exec", {"command": "exit 3"})
    assert ok.ok and sorted(ok.output["output"].splitlines()) == ["err", "hi"] and ok.output["exit_code"] == 0
    assert failed.ok and failed.output["exit_code"] == 3


async def test_files_round_trip_edit_and_patch(config: Any) -> None:
    """write, read, edit and apply_patch agree with what a command sees in the workspace."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:c2")
        assert (await sess.call("write", {"path": "d/a.txt", "content": "one\ntwo\n"})).ok
        assert (await sess.call("edit", {"path": "d/a.txt", "old_string": "two", "new_string": "2"})).ok
        patch = "*** Begin Patch\n*** Add File: d/b.txt\n+bee\n*** End Patch\n"
        assert (await sess.call("apply_patch", {"input": patch})).ok
        seen = await sess.call("exec", {"command": "cat d/a.txt d/b.txt"})
        read = await sess.call("read", {"path": "d/a.txt"})
    assert seen.output["output"] == "one\n2\nbee\n"
    assert read.ok and "one" in read.output["content"] and "2" in read.output["content"]


async def test_a_link_planted_by_a_command_is_never_followed(config: Any) -> None:
    """A symlink made by exec (to a file outside the workspace) is refused by read and write."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:c3")
        assert (await sess.call("exec", {"command": "ln -s /etc/hostname leak"})).ok
        read = await sess.call("read", {"path": "leak"})
        write = await sess.call("write", {"path": "leak/x", "content": "x"})
    assert read.error is not None and read.error.code == "PERMISSION_DENIED"
    assert write.error is not None and write.error.code == "PERMISSION_DENIED"


@pytest.mark.slow
async def test_timeout_kills_everything_the_command_started(config: Any) -> None:
    """A timeout kills the command and its background child; nothing of the call is left."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:c4")
        result = await sess.call("exec", {"command": "sleep 97 & sleep 97", "timeout_s": 0.3})
        assert result.error is not None and result.error.code == "TIMEOUT"
    assert await gone("sleep 9[7]")


async def test_background_process_poll_and_kill(config: Any) -> None:
    """A background command is polled to completion; another is killed and reported so."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:c5")
        done = await sess.call("exec", {"command": "echo started; exit 4", "background": True})
        with anyio.fail_after(30):
            while (polled := await sess.call("process", {"action": "poll", "id": done.output["process_id"]})).output[
                "status"
            ] == "running":
                await anyio.sleep(0.1)
        long = await sess.call("exec", {"command": "sleep 96", "background": True})
        killed = await sess.call("process", {"action": "kill", "id": long.output["process_id"]})
    assert polled.output["status"] == "exited" and polled.output["exit_code"] == 4
    assert "started" in polled.output["output"]
    assert killed.ok and killed.output["status"] in ("killed", "exited")


async def test_missing_file_and_escape_are_coded_errors(config: Any) -> None:
    """Reading a missing file is FILE_NOT_FOUND; a path outside the workspace is PERMISSION_DENIED."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:c6")
        missing = await sess.call("read", {"path": "nope.txt"})
        escape = await sess.call("read", {"path": "../../etc/passwd"})
    assert missing.error is not None and missing.error.code == "FILE_NOT_FOUND"
    assert escape.error is not None and escape.error.code == "PERMISSION_DENIED"


async def gone(pattern: str) -> bool:
    """No process matching `pattern` (pgrep -f) is left, polled with a deadline.

    Sandboxes' processes are visible from the host's pid namespace too, so one check serves all.
    """
    with anyio.fail_after(10):
        while subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.strip():
            await anyio.sleep(0.05)
    return True


@pytest.mark.slow
async def test_a_cancelled_call_kills_its_command(config: Any) -> None:
    """When the caller gives up (its task is cancelled), the command and its children die too."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:c7")
        assert (await sess.call("exec", {"command": "true"})).ok  # the sandbox exists first
        with anyio.move_on_after(0.5):
            await sess.call("exec", {"command": "sleep 979 & sleep 979"})
    assert await gone("sleep 97[9]")


async def test_workdir_outside_the_workspace_is_refused(config: Any) -> None:
    """exec's workdir may not leave the workspace (PERMISSION_DENIED), and `.` is the workspace."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:c8")
        assert (await sess.call("write", {"path": "here.txt", "content": "x"})).ok
        inside = await sess.call("exec", {"command": "ls", "workdir": "."})
        outside = await sess.call("exec", {"command": "pwd", "workdir": "../.."})
    assert inside.ok and "here.txt" in inside.output["output"]
    assert outside.error is not None and outside.error.code == "PERMISSION_DENIED"


async def test_mode_off_accepts_absolute_paths_inside_the_workspace(make_config: Any, tmp_path: Path) -> None:
    """On the host (mode off) the workspace's own absolute path is a valid tool path; others are not."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "decoy.txt").write_text("DECOY\n")
    config = make_config(f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")
        assert not sess.sandboxed
        assert (await sess.call("write", {"path": f"{ws}/f.txt", "content": "three\n"})).ok
        read = await sess.call("read", {"path": f"{ws}/f.txt"})
        other = await sess.call("write", {"path": str(tmp_path / "decoy.txt"), "content": "X"})
    assert read.ok and read.output["content"] == "three\n"
    assert other.error is not None and other.error.code == "PERMISSION_DENIED"
    assert (tmp_path / "decoy.txt").read_text() == "DECOY\n"
