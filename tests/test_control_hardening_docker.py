"""Issue 16 approval attacks against the real engine: a command hidden between private-key
markers, and `process write` to an approved interpreter in the sandbox."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator, load_config
from sandbox.journal.store import Approval
from tests.cli_helpers import run_cli

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

WRAPPED = (
    'echo "-----BEGIN OPENSSH PRIVATE KEY-----"; touch /workspace/hidden-ran; '
    'echo dG91Y2ggL3dvcmtzcGFjZS9iNjQ= | base64 -d | sh; echo "-----END OPENSSH PRIVATE KEY-----"'
)


def config_file(tmp_path: Path, instance: str, approvals: str) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    os.chown(ws, 1000, 1000)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\ntools: {{approvals: {approvals}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_access: rw}}, "
        f"list: [{{id: a, workspace: '{ws}'}}]}}\n"
    )
    return cfg


async def pending(orch: Orchestrator) -> Approval:
    """The one pending approval, once it is there."""
    with anyio.fail_after(60):
        while not (found := orch.pending_approvals()):
            await anyio.sleep(0.05)
    return found[0]


async def test_command_between_key_markers_is_shown_whole_and_runs_only_approved(tmp_path: Path, instance: str) -> None:
    """`approvals list`, `show` and `--json` show the code between PRIVATE KEY markers; it runs once approved."""
    cfg = config_file(tmp_path, instance, "{require: [exec], timeout_s: 120}")
    ws = tmp_path / "ws"
    async with Orchestrator(load_config(cfg)) as orch:
        sess = orch.session("agent:a:s1")
        try:
            results: list[Any] = []
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    results.append(await sess.call("exec", {"command": WRAPPED}))

                tg.start_soon(run)
                waiting = await pending(orch)
                listed = run_cli("approvals", "list", "--json", config=cfg)
                shown = run_cli("approvals", "show", waiting.id, config=cfg)
                shown_json = run_cli("approvals", "show", waiting.id, "--json", config=cfg)
                assert not (ws / "hidden-ran").exists()
                approved = run_cli("approvals", "approve", waiting.id, config=cfg)
                assert approved.returncode == 0, approved.stderr
        finally:
            await sess.close()
    assert json.loads(listed.stdout)[0]["arguments"]["command"] == WRAPPED
    assert "touch /workspace/hidden-ran; echo dG91Y2ggL3dvcmtzcGFjZS9iNjQ= | base64 -d | sh" in shown.stdout
    assert json.loads(shown_json.stdout)["arguments"]["command"] == WRAPPED
    assert results[0].ok, results[0]
    assert (ws / "hidden-ran").exists() and (ws / "b64").exists()


async def test_process_write_to_an_approved_sandbox_shell_waits_for_approval(tmp_path: Path, instance: str) -> None:
    """A shell approved once in the sandbox cannot be fed commands through `process write` without a new approval."""
    cfg = config_file(tmp_path, instance, "{require: [exec], timeout_s: 1}")
    ws = tmp_path / "ws"
    async with Orchestrator(load_config(cfg)) as orch:
        sess = orch.session("agent:a:s2")
        try:
            started: list[Any] = []
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    command = 'while read line; do eval "$line"; done'
                    started.append(await sess.call("exec", {"command": command, "background": True}))

                tg.start_soon(run)
                orch.approve((await pending(orch)).id)
            pid = started[0].output["process_id"]
            sent = await sess.call("process", {"action": "write", "id": pid, "data": "touch /workspace/pwned\n"})
            polled = await sess.call("process", {"action": "poll", "id": pid})
            await anyio.sleep(0.5)
            assert sent.error is not None and sent.error.code == "APPROVAL_TIMEOUT"
            assert polled.ok and polled.output["status"] == "running"
            assert not (ws / "pwned").exists()
            fed: list[Any] = []
            async with anyio.create_task_group() as tg:

                async def feed() -> None:
                    fed.append(
                        await sess.call("process", {"action": "write", "id": pid, "data": "touch /workspace/ok\n"})
                    )

                tg.start_soon(feed)
                waiting = await pending(orch)
                assert waiting.tool == "process" and waiting.arguments["data"] == "touch /workspace/ok\n"
                orch.approve(waiting.id)
            with anyio.fail_after(10):
                while not (ws / "ok").exists():
                    await anyio.sleep(0.1)
            assert fed[0].ok
        finally:
            await sess.close()
