"""compose.yaml for real: the service image is built (scripts/service-image), docker-compose brings up
the one-shot image build and the service, and an HTTP client makes a sandboxed call through it.
The service creates the sandbox on the host's engine through the socket, with a scratch
workspace at the same path on the host and in the service (what compose.yaml promises)."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.runtime.naming import Labels
from tests.service_helpers import free_port, wait_healthy

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]
ROOT = Path(__file__).resolve().parent.parent


def compose_v2_present() -> bool:
    found = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, check=False)
    return found.returncode == 0 and (" 2." in found.stdout or " v2." in found.stdout)


@pytest.mark.parametrize("cli", [["docker-compose"], ["docker", "compose"]], ids=["compose-1.29", "compose-v2"])
def test_compose_brings_up_the_service_and_it_runs_a_sandboxed_call(
    tmp_path: Path, instance: str, docker_client: Any, service_image: str, cli: list[str]
) -> None:
    """compose up (Debian's docker-compose 1.29, and compose v2): /healthz, the tenant's agents,
    an exec in a sandbox, then down leaves nothing."""
    if cli == ["docker", "compose"] and not compose_v2_present():
        pytest.skip("no compose v2 on this machine (scripts/compose-v2 installs it; .ci/run does)")
    token = "sbx_" + secrets.token_urlsafe(16)
    workspaces = tmp_path / "ws"
    workspaces.mkdir()
    config = tmp_path / "sandbox.yaml"
    config.write_text(
        f"state_dir: /var/lib/agent-sandbox\ninstance: {instance}\n"
        f"tenants: [{{id: acme, tokens: [{{name: t, sha256: {hashlib.sha256(token.encode()).hexdigest()}}}]}}]\n"
        "agents:\n"
        f"  defaults: {{sandbox: {{mode: all, scope: session, workspace_root: {workspaces / 'scratch'}}}}}\n"
        "  list: [{id: coder, tenant: acme, default: true}]\n"
    )
    port = free_port()
    project = f"sbx{instance.replace('-', '')}"
    env = {
        **os.environ,
        "SANDBOX_CONFIG_FILE": str(config),
        "SANDBOX_WORKSPACES": str(workspaces),
        "SANDBOX_PORT": str(port),
    }
    compose = [*cli, "-p", project, "-f", str(ROOT / "compose.yaml")]
    try:
        up = subprocess.run([*compose, "up", "-d"], capture_output=True, text=True, env=env, timeout=600)
        assert up.returncode == 0, up.stderr[-2000:]
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, seconds=60)
        headers = {"Authorization": f"Bearer {token}"}
        assert [a["id"] for a in httpx.get(f"{url}/v1/agents", headers=headers).json()] == ["coder"]
        r = httpx.post(
            f"{url}/v1/sessions/t1/calls",
            headers=headers,
            json={"tool": "exec", "args": {"command": "echo hi > note.txt && cat note.txt && id -u"}},
            timeout=120,
        )
        body = r.json()
        assert r.status_code == 200 and body["ok"] and body["output"]["output"] == "hi\n1000\n", body
        # the scratch workspace the engine mounted is this host folder (same path in the service)
        assert [p.read_text() for p in (workspaces / "scratch").glob("*/*/note.txt")] == ["hi\n"]
        assert httpx.delete(f"{url}/v1/sessions/t1", headers=headers, timeout=120).status_code == 200
    finally:
        down = subprocess.run([*compose, "down", "-v"], capture_output=True, text=True, env=env, timeout=300)
    assert down.returncode == 0, down.stderr[-2000:]
    assert docker_client.containers.list(all=True, filters={"label": f"{Labels.INSTANCE}={instance}"}) == []
