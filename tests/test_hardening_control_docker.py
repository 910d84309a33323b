"""Issue 10 attacks that involve the sandbox itself: sockets it makes, links it plants at `.sandbox`,
and where the full outputs of a read-only workspace go."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


def sandbox_config(make_config: Any, ws: Path, access: str = "rw", extra: str = "") -> Any:
    ws.mkdir(exist_ok=True)
    os.chown(ws, 1000, 1000)
    return make_config(f"""
results: {{max_chars: 200}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: {access}}}}}
  list: [{{id: a, workspace: "{ws}"}}]
{extra}""")


async def test_socket_made_in_the_sandbox_is_not_read(make_config: Any, tmp_path: Path) -> None:
    """A Unix socket the sandbox makes in its workspace: `read` says PERMISSION_DENIED, not INTERNAL.

    The strict seccomp profile denies socket(AF_UNIX), so the sandbox makes the socket node with
    mknod, which needs no privilege and no socket.
    """
    ws = tmp_path / "ws"
    async with Orchestrator(sandbox_config(make_config, ws)) as orch:
        sess = orch.session("agent:a:s1")
        try:
            made = await sess.call(
                "exec",
                {
                    "command": 'python3 -c "import os, stat; '
                    "os.mknod('/workspace/agent.sock', stat.S_IFSOCK | 0o600)\" && ls -l /workspace/agent.sock"
                },
            )
            assert made.ok and made.output["exit_code"] == 0, made
            assert stat.S_ISSOCK(os.lstat(ws / "agent.sock").st_mode)
            r = await sess.call("read", {"path": "agent.sock"})
            assert r.error is not None, r
            assert r.error.code == "PERMISSION_DENIED" and "not a regular file" in r.error.message
        finally:
            await sess.close()


async def test_planted_sandbox_link_costs_the_copy_not_the_result(make_config: Any, tmp_path: Path) -> None:
    """The sandbox links `.sandbox` to a host folder: a long output stays ok with its marker and a warning."""
    ws = tmp_path / "ws"
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    async with Orchestrator(sandbox_config(make_config, ws)) as orch:
        sess = orch.session("agent:a:s2")
        try:
            planted = await sess.call("exec", {"command": f"ln -s {decoy} /workspace/.sandbox && echo planted"})
            assert planted.ok and "planted" in planted.output["output"]
            r = await sess.call("exec", {"command": "seq 1 5000"})
            assert orch.journal is not None
            stages = [e.stage for e in orch.journal.events(call_id=r.call_id)]
        finally:
            await sess.close()
    assert r.ok and r.truncated and r.full_output_path is None, r
    assert "truncated" in r.output["output"] and r.output["output"].rstrip().endswith("5000")
    assert any("could not be saved" in w for w in r.warnings), r.warnings
    assert list(decoy.iterdir()) == []
    assert stages[-1] == "finished"


async def test_read_only_workspace_keeps_no_full_outputs(make_config: Any, tmp_path: Path) -> None:
    """Full outputs of a read-only workspace are not kept anywhere on the host (no host path is
    handed out): the result is cut, with a warning saying why."""
    ws = tmp_path / "ws"
    async with Orchestrator(sandbox_config(make_config, ws, access="ro")) as orch:
        sess = orch.session("agent:a:s3")
        try:
            for i in range(3):
                r = await sess.call("exec", {"command": f"seq {i} {i + 3000}"})
                assert r.ok and r.truncated and r.full_output_path is None, r
                assert any("read-only" in w for w in r.warnings), r.warnings
            state = sess.state_dir
        finally:
            await sess.close()
    assert not list(state.rglob("*.txt"))
    assert not (ws / ".sandbox").exists()
