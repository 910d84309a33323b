"""Recovery that knows who is alive, against the real engine and real CLI processes.

Two CLI calls on one state dir: the second one's start-up recovery leaves the first one's running
command alone (it used to kill it, and the first then reported ok with exit 137). A CLI call
killed with SIGKILL: its command would run on in the sandbox; the next CLI call's recovery kills
it and journals the call as abandoned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox.journal.store import Journal
from sandbox.runtime.naming import Labels

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]


def config(tmp_path: Path, instance: str) -> Path:
    path = tmp_path / "sandbox.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\ninstance: {instance}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: agent}}}\n"
    )
    return path


def cli(cfg: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "sandbox", "--config", str(cfg), *args]


def wait_for_stage(tmp_path: Path, stage: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        journal = Journal(tmp_path / "state" / "journal.sqlite3")
        try:
            if any(s == stage for _, _, s, _ in journal.open_calls()):
                return
        finally:
            journal.close()
        time.sleep(0.1)
    raise AssertionError(f"no call reached {stage}")


def test_a_second_cli_call_leaves_a_live_ones_command_alone(tmp_path: Path, instance: str) -> None:
    """The second call's start-up recovery sees the first call's owner alive and does not touch it."""
    cfg = config(tmp_path, instance)
    first = subprocess.Popen(
        cli(cfg, "call", "--session", "agent:main:one", "exec", '{"command": "sleep 4; echo slept"}'),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_stage(tmp_path, "running")
        second = subprocess.run(
            cli(cfg, "call", "--session", "agent:main:two", "exec", '{"command": "echo second"}'),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 0, second.stderr
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    result = json.loads(out)
    assert result["ok"] and result["output"]["exit_code"] == 0 and "slept" in result["output"]["output"], (out, err)


def test_a_killed_cli_calls_command_is_killed_by_the_next_one(
    tmp_path: Path, instance: str, docker_client: Any
) -> None:
    """SIGKILL mid-call: the next CLI call's recovery kills the orphaned command and journals why."""
    cfg = config(tmp_path, instance)
    doomed = subprocess.Popen(
        cli(cfg, "call", "--session", "agent:main:doomed", "exec", '{"command": "sleep 111"}'),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    label = {"label": f"{Labels.INSTANCE}={instance}"}
    deadline = time.monotonic() + 60
    container = None
    while time.monotonic() < deadline and container is None:
        for c in docker_client.containers.list(filters=label, sparse=True):
            if "sleep 111" in json.dumps(docker_client.api.top(c.id)):
                container = c
        time.sleep(0.1)
    assert container is not None, "the command never started"
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    time.sleep(0.5)
    assert "sleep 111" in json.dumps(docker_client.api.top(container.id))  # the orphan runs on
    later = subprocess.run(
        cli(cfg, "call", "--session", "agent:main:later", "exec", '{"command": "echo later"}'),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert later.returncode == 0, later.stderr
    assert "sleep 111" not in json.dumps(docker_client.api.top(container.id))
    journal = Journal(tmp_path / "state" / "journal.sqlite3")
    try:
        assert journal.open_calls() == []
        stages = [e.stage for e in journal.events(session="agent:main:doomed")]
    finally:
        journal.close()
    assert stages[-1] == "abandoned", stages
