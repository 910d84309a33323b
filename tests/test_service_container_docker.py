"""The service image run as a container with testcontainers, as an operator would run it: the
engine's socket, a read-only config, workspaces at the same path as on the host, its state on a
host folder. Real clients: httpx (REST, tenants kept apart) and the `mcp` SDK over streamable
HTTP. `docker stop` drains it: the call in flight is stopped with a 503 and the container exits
on its own, before the engine would SIGKILL it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sandbox.runtime.naming import Labels
from tests.conftest import RUN_ID, TEST_LABEL
from tests.service_helpers import TOKEN_A, TOKEN_B, sha, wait_healthy

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}


def write_config(tmp_path: Path, instance: str) -> tuple[Path, Path, Path]:
    workspaces, state = tmp_path / "ws", tmp_path / "state"
    workspaces.mkdir()
    state.mkdir()
    config = tmp_path / "sandbox.yaml"
    config.write_text(f"""
state_dir: {state}
instance: {instance}
tenants:
  - {{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_root: {workspaces / "scratch"}}}}}
  list:
    - {{id: coder, tenant: acme, default: true}}
    - {{id: rival, tenant: globex}}
""")
    return config, workspaces, state


async def mcp_tools_and_call(url: str) -> tuple[list[str], Any]:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers={**A, "X-Sandbox-Session": "mcp-1"}, timeout=60) as http,
        streamable_http_client(f"{url}/mcp/", http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        names = sorted(t.name for t in (await client.list_tools()).tools)
        return names, await client.call_tool("exec", {"command": "echo from-mcp"})


# the first use builds sandbox-service:latest (pip wheels, then docker build): minutes on a
# fresh, loaded machine, past the suite's 300 s per test
@pytest.mark.timeout(1200)
def test_the_service_container_serves_tenants_and_drains_on_stop(
    tmp_path: Path, instance: str, docker_client: Any, service_image: str
) -> None:
    from testcontainers.core.container import DockerContainer

    config, workspaces, state = write_config(tmp_path, instance)
    container = (
        DockerContainer(service_image)
        .with_command(["--config", "/etc/agent-sandbox/sandbox.yaml", "serve", "--host", "0.0.0.0", "--grace", "5"])
        .with_exposed_ports(8710)
        .with_volume_mapping("/var/run/docker.sock", "/var/run/docker.sock", "rw")
        .with_volume_mapping(str(config), "/etc/agent-sandbox/sandbox.yaml", "ro")
        .with_volume_mapping(str(workspaces), str(workspaces), "rw")
        .with_volume_mapping(str(state), str(state), "rw")
        .with_kwargs(labels={TEST_LABEL: RUN_ID})
    )
    container.start()
    try:
        url = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(8710)}"
        try:
            wait_healthy(url)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {container.get_logs()}") from exc
        assert httpx.get(f"{url}/v1/agents").status_code == 401
        assert [a["id"] for a in httpx.get(f"{url}/v1/agents", headers=A).json()] == ["coder"]

        r = httpx.post(
            f"{url}/v1/sessions/work/calls",
            headers=A,
            json={"tool": "exec", "args": {"command": "echo acme-only > secret.txt && id -u"}},
            timeout=120,
        )
        assert r.status_code == 200 and r.json()["ok"] and r.json()["output"]["output"] == "1000\n", r.text
        # the sandbox's scratch workspace is the host folder the service named (same path inside)
        assert [p.read_text() for p in (workspaces / "scratch").glob("*/*/secret.txt")] == ["acme-only\n"]
        # the other tenant: the same key is its own session; acme's resources are not found
        theirs = httpx.post(
            f"{url}/v1/sessions/work/calls",
            headers=B,
            json={"tool": "exec", "args": {"command": "cat secret.txt 2>&1; true"}},
            timeout=120,
        ).json()
        assert "No such file" in theirs["output"]["output"], theirs
        assert (
            httpx.post(
                f"{url}/v1/sessions/work/calls",
                headers=B,
                json={"agent": "coder", "tool": "read", "args": {"path": "x"}},
            ).status_code
            == 404
        )
        assert {s["agent"] for s in httpx.get(f"{url}/v1/sandboxes", headers=B).json()} == {"rival"}

        names, result = anyio.run(mcp_tools_and_call, url)
        assert "exec" in names and not result.is_error, (names, result)
        assert json.loads(result.content[0].text)["output"]["output"] == "from-mcp\n", result

        # docker stop with a call in flight: the call is stopped (503), the container exits by itself
        long_out: dict[str, Any] = {}

        def long_call() -> None:
            r = httpx.post(
                f"{url}/v1/sessions/work/calls",
                headers=A,
                json={"tool": "exec", "args": {"command": "sleep 250", "timeout_s": 600}},
                timeout=120,
            )
            long_out["status"], long_out["body"] = r.status_code, r.json()

        caller = threading.Thread(target=long_call)
        caller.start()
        label = {"label": f"{Labels.INSTANCE}={instance}"}
        deadline = time.monotonic() + 60
        while "sleep 250" not in json.dumps(
            [docker_client.api.top(c.id) for c in docker_client.containers.list(filters=label)]
        ):
            assert time.monotonic() < deadline, "the long call never started"
            time.sleep(0.1)
        wrapped = container.get_wrapped_container()
        started = time.monotonic()
        wrapped.stop(timeout=60)
        took = time.monotonic() - started
        caller.join(timeout=30)
        wrapped.reload()
        exit_code = wrapped.attrs["State"]["ExitCode"]
        print(f"docker stop took {took:.1f}s (grace 5s); exit code {exit_code}")
        assert exit_code != 137, container.get_logs()  # it drained and exited; the engine did not SIGKILL it
        assert long_out["status"] == 503 and "service stopped" in long_out["body"]["detail"], long_out
        sandboxes = docker_client.containers.list(filters=label)
        assert sandboxes and "sleep 250" not in json.dumps([docker_client.api.top(c.id) for c in sandboxes])
    finally:
        container.stop()
