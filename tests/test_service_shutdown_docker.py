"""SIGTERM of a real `sandbox serve` process with calls in flight, against the real engine.

A call that ends within the grace period finishes and is answered; one that does not is stopped:
its command is killed in the sandbox and the journal marks it abandoned (never left open). An
event stream does not hold the drain. After a restart `sandbox list` shows only the sessions'
own sandboxes, matching the config, with nothing of the stopped call running in them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.engine.executor import CANCELLED_REASON
from sandbox.journal.store import Journal
from sandbox.runtime.naming import Labels
from tests.service_helpers import TOKEN_A, free_port, sha, wait_healthy

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

A = {"Authorization": f"Bearer {TOKEN_A}"}
GRACE_S = 6


def write_config(tmp_path: Path, instance: str) -> Path:
    path = tmp_path / "sandbox.yaml"
    path.write_text(f"""
state_dir: {tmp_path / "state"}
instance: {instance}
tenants: [{{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list: [{{id: alpha, tenant: acme}}]
""")
    return path


def start(cfg: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox", "--config", str(cfg), "serve", "--port", str(port), "--grace", str(GRACE_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_healthy(
            f"http://127.0.0.1:{port}", seconds=60, gone=lambda: None if proc.poll() is None else proc.communicate()[0]
        )
    except AssertionError:
        if proc.poll() is None:
            proc.kill()
        raise
    return proc


def post_call(url: str, key: str, command: str, into: dict[str, Any]) -> None:
    try:
        r = httpx.post(
            f"{url}/v1/sessions/{key}/calls",
            headers=A,
            json={"tool": "exec", "args": {"command": command, "timeout_s": 600}},
            timeout=120,
        )
        into["status"], into["body"] = r.status_code, r.json() if r.content else None
    except httpx.HTTPError as exc:  # recorded for the assertion's message
        into["error"] = repr(exc)


def running_calls(state: Path) -> int:
    journal = Journal(state / "journal.sqlite3")
    try:
        return sum(1 for _, _, stage, _ in journal.open_calls() if stage == "running")
    finally:
        journal.close()


def test_sigterm_finishes_short_calls_and_stops_long_ones(tmp_path: Path, instance: str, docker_client: Any) -> None:
    cfg = write_config(tmp_path, instance)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start(cfg, port)
    try:
        for key in ("long", "short"):  # both sandboxes exist before the race
            r = httpx.post(
                f"{url}/v1/sessions/{key}/calls",
                headers=A,
                json={"tool": "exec", "args": {"command": "true"}},
                timeout=120,
            )
            assert r.status_code == 200 and r.json()["ok"], r.text
        long_out: dict[str, Any] = {}
        short_out: dict[str, Any] = {}
        threads = [
            threading.Thread(target=post_call, args=(url, "long", "echo started; sleep 300", long_out)),
            threading.Thread(target=post_call, args=(url, "short", "sleep 3; echo done", short_out)),
        ]
        # an event stream open during the drain must not hold it to the grace period's end
        events = subprocess.Popen(
            ["curl", "-sN", "-H", f"Authorization: Bearer {TOKEN_A}", f"{url}/v1/sessions/long/events"],
            stdout=subprocess.DEVNULL,
        )
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while running_calls(tmp_path / "state") < 2:
            assert time.monotonic() < deadline, "the calls never ran"
            time.sleep(0.05)
        stopped_at = time.monotonic()
        server.send_signal(signal.SIGTERM)
        output = server.communicate(timeout=GRACE_S + 60)[0]
        took = time.monotonic() - stopped_at
        for t in threads:
            t.join(timeout=30)
        events.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    print(f"drain took {took:.1f}s (grace {GRACE_S}s)\n{output}")

    # the short call finished inside the grace period and was answered
    assert short_out.get("status") == 200 and short_out["body"]["ok"], short_out
    assert short_out["body"]["output"]["output"] == "done\n"
    # the long one was stopped: a 503 that says so, its command killed, the journal says why
    assert long_out.get("status") == 503 and "service stopped" in long_out["body"]["detail"], long_out
    journal = Journal(tmp_path / "state" / "journal.sqlite3")
    try:
        assert journal.open_calls() == []
        long_events = [e for e in journal.events(session="agent:alpha:long") if e.tool == "exec"]
    finally:
        journal.close()
    last = long_events[-1]
    assert last.stage == "abandoned" and last.data["reason"] == CANCELLED_REASON, long_events
    label = {"label": f"{Labels.INSTANCE}={instance}"}
    containers = docker_client.containers.list(filters=label)
    assert "sleep 300" not in json.dumps([docker_client.api.top(c.id) for c in containers])

    # after a restart: only the two sessions' sandboxes, matching the config, nothing stray
    server = start(cfg, port)
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "sandbox", "--config", str(cfg), "list", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted(r["scope_key"] for r in rows) == ["agent:alpha:long", "agent:alpha:short"], rows
    assert all(r["config_match"] and r["status"] == "running" for r in rows), rows
