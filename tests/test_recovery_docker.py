"""kill -9 of the orchestrator at the worst moments, then a restart: the journal tells the truth,
running work is re-attached (never restarted), and nothing runs twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from sandbox import Orchestrator, load_config

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

SCRIPT = """
import anyio, sys, json
from sandbox import Orchestrator, load_config
async def main():
    async with Orchestrator(load_config(sys.argv[1])) as orch:
        sess = orch.session("agent:a:crash")
        key = sys.argv[4] if len(sys.argv) > 4 else None
        r = await sess.call(sys.argv[2], json.loads(sys.argv[3]), idempotency_key=key)
        print(r.model_dump_json(), flush=True)
        await anyio.sleep(3600)
anyio.run(main)
"""


def config_file(tmp_path: Path, instance: str, extra: str = "") -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    os.chown(ws, 1000, 1000)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\n{extra}\n"
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: agent, workspace_access: rw}}}}, list: [{{id: a, workspace: '{ws}'}}]}}\n"
    )
    return cfg


def start(cfg: Path, tool: str, args: dict[str, object], key: str | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(cfg), tool, json.dumps(args), *([key] if key else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdout:
        proc.stdout.close()


async def recover(cfg: Path) -> tuple[list[dict[str, object]], list[str]]:
    async with Orchestrator(load_config(cfg)) as orch:
        outcomes = await orch.recover()
        stages = [e.stage for e in orch.journal.events(limit=10**6)]
    return outcomes, stages


def test_background_exec_is_reattached_not_restarted(tmp_path: Path, instance: str) -> None:
    """A background command survives the crash, is re-attached by the next process, and ran once."""
    cfg = config_file(tmp_path, instance)
    cmd = "echo start >> starts.log; sleep 4; echo done"
    proc = start(cfg, "exec", {"command": cmd, "background": True})
    assert proc.stdout is not None
    result = json.loads(proc.stdout.readline())
    kill(proc)
    outcomes, stages = anyio.run(recover, cfg)
    assert [o["now"] for o in outcomes] == ["process_reattached"] and stages[-1] == "process_reattached"
    deadline = time.monotonic() + 60  # the command takes 4 s: poll for its end, do not time it
    while [o["now"] for o in outcomes] == ["process_reattached"] and time.monotonic() < deadline:
        time.sleep(0.2)
        outcomes, stages = anyio.run(recover, cfg)
    assert [o["now"] for o in outcomes] == ["process_exited"]
    assert (tmp_path / "ws" / "starts.log").read_text() == "start\n"  # never restarted

    async def poll() -> dict[str, object]:
        async with Orchestrator(load_config(cfg)) as orch:
            r = await orch.session("agent:a:crash").call(
                "process", {"action": "poll", "id": result["output"]["process_id"]}
            )
            return dict(r.output)

    polled = anyio.run(poll)
    assert polled["status"] == "exited" and polled["output"] == "done\n"


def test_pending_approval_keeps_waiting_and_nothing_runs(tmp_path: Path, instance: str) -> None:
    """A call suspended for approval stays pending across the crash; deciding it later runs nothing."""
    cfg = config_file(tmp_path, instance, "tools: {approvals: {require: [write], timeout_s: 600}}")
    proc = start(cfg, "write", {"path": "approved.txt", "content": "x"})
    journal_db = tmp_path / "state" / "journal.sqlite3"
    deadline = time.monotonic() + 60
    listed = ""
    while time.monotonic() < deadline:
        listed = subprocess.run(
            [sys.executable, "-m", "sandbox", "--config", str(cfg), "approvals", "list", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        if journal_db.exists() and listed.strip() not in ("", "[]"):
            break
        time.sleep(0.3)
    kill(proc)
    pending = json.loads(listed)
    assert len(pending) == 1 and pending[0]["tool"] == "write"
    outcomes, stages = anyio.run(recover, cfg)
    assert [o["now"] for o in outcomes] == ["awaiting_approval"] and stages[-1] == "awaiting_approval"
    approve = subprocess.run(
        [sys.executable, "-m", "sandbox", "--config", str(cfg), "approvals", "approve", pending[0]["id"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert approve.returncode == 0, approve.stderr
    outcomes, stages = anyio.run(recover, cfg)
    assert [o["now"] for o in outcomes] == ["abandoned"] and stages[-1] == "abandoned"
    assert not (tmp_path / "ws" / "approved.txt").exists()  # nothing ran, and nothing will


def test_call_cut_by_the_crash_is_abandoned_and_its_process_killed(tmp_path: Path, instance: str) -> None:
    """A foreground command running when the orchestrator died is killed on restart and not re-run."""
    cfg = config_file(tmp_path, instance)
    proc = start(cfg, "exec", {"command": "echo began >> began.log; sleep 977", "timeout_s": 600})
    began = tmp_path / "ws" / "began.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not began.exists():
        time.sleep(0.1)
    kill(proc)
    outcomes, stages = anyio.run(recover, cfg)
    assert [o["now"] for o in outcomes] == ["abandoned"] and stages[-1] == "abandoned"

    async def ps() -> str:
        async with Orchestrator(load_config(cfg)) as orch:
            r = await orch.session("agent:a:crash").call("exec", {"command": "ps -eo args --no-headers"})
            return str(r.output["output"])

    assert "sleep 977" not in anyio.run(ps)
    assert began.read_text() == "began\n"


def test_a_keyed_call_cut_by_a_crash_is_adopted_and_its_key_answers_the_true_result(
    tmp_path: Path, instance: str
) -> None:
    """kill -9 during a keyed call: its command (a durable process) runs on. A one-shot recovery
    (the CLI's) leaves it for a process that stays; the next orchestrator that stays adopts it,
    and a repeat of the key answers the command's true result. The command ran once."""
    cfg = config_file(tmp_path, instance)
    command: dict[str, object] = {"command": "echo start >> starts.log; sleep 3; echo finished"}
    proc = start(cfg, "exec", command, key="crash-1")
    deadline = time.monotonic() + 60
    while not (tmp_path / "ws" / "starts.log").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    kill(proc)

    async def one_shot() -> list[dict[str, object]]:
        async with Orchestrator(load_config(cfg)) as orch:
            return await orch.recover(adopt=False)

    assert anyio.run(one_shot) == []  # nothing settled, nothing killed

    async def adopt_then_repeat() -> tuple[list[dict[str, object]], object]:
        async with Orchestrator(load_config(cfg)) as orch:
            outcomes = await orch.recover()
            with anyio.fail_after(60):
                again = await orch.session("agent:a:crash").call("exec", command, idempotency_key="crash-1")
            return outcomes, again

    outcomes, again = anyio.run(adopt_then_repeat)
    assert [o["now"] for o in outcomes] == ["adopted"]
    assert again.ok and again.output["output"] == "finished\n", again  # type: ignore[attr-defined]
    assert (tmp_path / "ws" / "starts.log").read_text() == "start\n"
