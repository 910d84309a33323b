"""compose.yaml's `replicas` profile for real: PostgreSQL built from images/postgres, the schema
migrated by the one-shot `migrate`, and two service replicas on it. A call through replica A is
in replica B's logs; an MCP client whose requests alternate between them (no sticky sessions,
`service.mcp_stateless`) keeps one sandbox session; `down -v` leaves nothing."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sandbox.runtime.naming import Labels
from tests.service_helpers import free_port, wait_healthy
from tests.test_compose_docker import compose_v2_present

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]
ROOT = Path(__file__).resolve().parent.parent
MCP = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _config(instance: str, token: str, workspaces: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "state_dir": "/var/lib/agent-sandbox",
        "instance": instance,
        "service": {"mcp_stateless": True},
        "tenants": [{"id": "acme", "tokens": [{"name": "ci", "sha256": hashlib.sha256(token.encode()).hexdigest()}]}],
        "agents": {
            "defaults": {
                "sandbox": {
                    "mode": "all",
                    "scope": "session",
                    "workspace_access": "none",
                    "workspace_root": str(workspaces / "scratch"),
                }
            },
            "list": [{"id": "coder", "tenant": "acme", "default": True}],
        },
    }


def _mcp_call(url: str, headers: dict[str, str], n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    answer = httpx.post(
        f"{url}/mcp/", headers={**headers, **MCP, "mcp-protocol-version": "2025-06-18"}, json=body, timeout=120
    )
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()["result"]["structuredContent"]
    return found


def test_the_replicas_profile_runs_two_replicas_on_one_postgresql(
    tmp_path: Path, instance: str, docker_client: Any, service_image: str
) -> None:
    cli = ["docker", "compose"] if compose_v2_present() else ["docker-compose"]
    token = "sbx_" + secrets.token_urlsafe(16)
    workspaces = tmp_path / "ws"
    workspaces.mkdir()
    config = tmp_path / "sandbox.yaml"
    config.write_text(yaml.safe_dump(_config(instance, token, workspaces)))
    port_a, port_b = free_port(), free_port()
    env = {
        **os.environ,
        "SANDBOX_CONFIG_FILE": str(config),
        "SANDBOX_WORKSPACES": str(workspaces),
        "SANDBOX_PG_PASSWORD": secrets.token_hex(16),
        "SANDBOX_PG_PORT": str(free_port()),
        "SANDBOX_PORT_A": str(port_a),
        "SANDBOX_PORT_B": str(port_b),
    }
    project = f"sbxr{instance.replace('-', '')}"
    compose = [*cli, "-p", project, "-f", str(ROOT / "compose.yaml"), "--profile", "replicas"]
    headers = {"Authorization": f"Bearer {token}"}
    try:
        up = subprocess.run(
            [*compose, "up", "-d", "--build", "replica-a", "replica-b"],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        assert up.returncode == 0, up.stderr[-3000:]
        url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
        wait_healthy(url_a, seconds=90)
        wait_healthy(url_b, seconds=90)
        ran = httpx.post(
            f"{url_a}/v1/sessions/t1/calls",
            headers=headers,
            json={"tool": "exec", "args": {"command": "echo from-a"}},
            timeout=120,
        )
        assert ran.status_code == 200 and ran.json()["ok"], ran.text
        call_id = ran.json()["call_id"]
        deadline = time.monotonic() + 30
        while not any(
            e["call_id"] == call_id and e["stage"] == "finished"
            for e in httpx.get(f"{url_b}/v1/logs", headers=headers, timeout=30).json()
        ):
            assert time.monotonic() < deadline, "replica B never showed replica A's call"
            time.sleep(0.2)
        # an MCP client behind a round-robin balancer: each request to the next replica
        wrote = _mcp_call(url_a, headers, 1, "exec", {"command": "echo kept > /tmp/mark && echo ok"})
        assert wrote["ok"], wrote
        read = _mcp_call(url_b, headers, 2, "exec", {"command": "cat /tmp/mark"})
        assert read["ok"] and read["output"]["output"] == "kept\n", read  # one sandbox session
        assert httpx.delete(f"{url_b}/v1/sessions/t1", headers=headers, timeout=120).status_code == 200
        assert httpx.delete(f"{url_a}/v1/sessions/mcp-default", headers=headers, timeout=120).status_code == 200
    except AssertionError as failure:
        logs = subprocess.run(
            [*compose, "logs", "--no-color", "--tail", "40"], capture_output=True, text=True, env=env, check=False
        )
        raise AssertionError(f"{failure}\n--- logs ---\n{logs.stdout[-6000:]}") from failure
    finally:
        down = subprocess.run([*compose, "down", "-v"], capture_output=True, text=True, env=env, timeout=300)
    assert down.returncode == 0, down.stderr[-2000:]
    assert docker_client.containers.list(all=True, filters={"label": f"{Labels.INSTANCE}={instance}"}) == []
