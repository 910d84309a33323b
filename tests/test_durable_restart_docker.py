"""Durable calls across a restarted service, with real `sandbox serve` processes and the real
engine (engine/handover.py, tools/handlers/durable.py): a submitted call's command runs on when
its service is killed with -9 or stopped with SIGTERM and `service.handover`, and the next
service adopts it and records its true outcome; nothing runs twice; a call whose sandbox went
meanwhile is abandoned with the reason."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from sandbox.journal.store import Journal
from sandbox.runtime.naming import Labels
from tests.conftest import RUN_ID
from tests.service_helpers import TOKEN_A, free_port, remove_instance, sha, wait_healthy

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

A = {"Authorization": f"Bearer {TOKEN_A}"}
COMMAND = "echo start >> runs.txt; sleep {s}; echo done >> runs.txt; echo done"


@pytest.fixture
def made() -> Iterator[list[str]]:
    """The instances a test's services ran under: their sandboxes go with the test."""
    instances: list[str] = []
    yield instances
    for instance in instances:
        remove_instance(instance)


def _config(tmp_path: Path, made: list[str], name: str, handover: bool) -> Path:
    instance = f"{name}{RUN_ID}"  # this run's own: another run's sandboxes are not touched
    made.append(instance)
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    path = tmp_path / "sandbox.yaml"
    path.write_text(f"""
state_dir: {tmp_path / "state"}
instance: {instance}
service: {{handover: {str(handover).lower()}}}
tenants: [{{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: rw}}}}
  list: [{{id: alpha, tenant: acme, workspace: {ws}}}]
""")
    return path


def _start(cfg: Path, port: int) -> subprocess.Popen[bytes]:
    with (cfg.parent / f"serve-{time.monotonic_ns()}.log").open("wb") as log:  # the child keeps its own
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "--config", str(cfg), "serve", "--port", str(port), "--grace", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_healthy(f"http://127.0.0.1:{port}", seconds=60, gone=lambda: None if proc.poll() is None else "exited")
    return proc


def _submit(url: str, seconds: float) -> str:
    answer = httpx.post(
        f"{url}/v1/sessions/agent:alpha:d1/calls",
        headers={**A, "Prefer": "respond-async"},
        json={"tool": "exec", "args": {"command": COMMAND.format(s=seconds), "timeout_s": 120}},
        timeout=60,
    )
    assert answer.status_code == 202, answer.text
    return answer.headers["Location"].rsplit("/", 1)[1]


def _until(what: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def _runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "ws" / "runs.txt"
    return path.read_text().split() if path.exists() else []


def _stages(tmp_path: Path, call_id: str) -> list[str]:
    journal = Journal(tmp_path / "state" / "journal.sqlite3")
    try:
        return [e.stage for e in journal.events(call_id=call_id)]
    finally:
        journal.close()


def _outcome(url: str, call_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/v1/calls/{call_id}", params={"wait": 60}, headers=A, timeout=90)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=60)


def test_kill_9_mid_call_then_start_again_records_the_true_outcome(tmp_path: Path, made: list[str]) -> None:
    """The service dies with -9 while `sleep` runs; the command finishes while no service runs;
    the next start adopts the call: finished, ok, with `done`, one run, `adopted` journaled."""
    cfg, port = _config(tmp_path, made, "dur9", handover=False), free_port()
    url = f"http://127.0.0.1:{port}"
    first = _start(cfg, port)
    try:
        call_id = _submit(url, 2)
        _until(lambda: _runs(tmp_path) == ["start"])
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        _until(lambda: _runs(tmp_path) == ["start", "done"])  # it ran on with nobody linked
    finally:
        _stop(first)
    second = _start(cfg, port)
    try:
        found = _outcome(url, call_id)
        assert found["state"] == "finished", found
        assert found["result"]["ok"] is True and "done" in found["result"]["output"]["output"], found
        assert found["result"]["output"]["exit_code"] == 0
    finally:
        _stop(second)
    assert _runs(tmp_path) == ["start", "done"]  # once
    stages = _stages(tmp_path, call_id)
    assert "durable_started" in stages and "adopted" in stages and stages[-1] == "finished", stages


def test_sigterm_with_handover_leaves_the_command_running_for_the_next_start(tmp_path: Path, made: list[str]) -> None:
    """SIGTERM with `service.handover: true`: the service exits without killing the command
    (`handed_over`); the next start adopts it while it still runs and records `done`."""
    cfg, port = _config(tmp_path, made, "durho", handover=True), free_port()
    url = f"http://127.0.0.1:{port}"
    first = _start(cfg, port)
    try:
        call_id = _submit(url, 6)
        _until(lambda: _runs(tmp_path) == ["start"])
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    finally:
        _stop(first)
    assert "handed_over" in _stages(tmp_path, call_id)
    assert _runs(tmp_path) == ["start"]  # still running: not killed
    second = _start(cfg, port)
    try:
        found = _outcome(url, call_id)
        assert found["state"] == "finished" and found["result"]["ok"] is True, found
        assert "done" in found["result"]["output"]["output"]
    finally:
        _stop(second)
    assert _runs(tmp_path) == ["start", "done"]
    stages = _stages(tmp_path, call_id)
    assert stages.index("handed_over") < stages.index("adopted") < stages.index("finished"), stages


def test_a_handed_over_call_whose_sandbox_went_is_abandoned_with_the_reason(tmp_path: Path, made: list[str]) -> None:
    cfg, port = _config(tmp_path, made, "durgone", handover=True), free_port()
    url = f"http://127.0.0.1:{port}"
    first = _start(cfg, port)
    try:
        call_id = _submit(url, 30)
        _until(lambda: _runs(tmp_path) == ["start"])
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    finally:
        _stop(first)
    client = docker.from_env()
    try:
        boxes = client.containers.list(all=True, filters={"label": f"{Labels.INSTANCE}={made[0]}"})
        assert boxes
        for box in boxes:  # removed from outside while no service runs
            box.remove(force=True)
    finally:
        client.close()
    second = _start(cfg, port)
    try:
        found = _outcome(url, call_id)
        assert found["state"] == "abandoned" and "sandbox is gone" in found["reason"], found
    finally:
        _stop(second)
    assert _runs(tmp_path) == ["start"]
    assert _stages(tmp_path, call_id)[-1] == "abandoned"
