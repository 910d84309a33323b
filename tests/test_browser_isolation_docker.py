"""Browser sandboxes as attack surface: one tenant's page against another tenant's browser, the
host, and other networks. Every target is a server this test starts; each refusal is shown by
the connection failing and by the canary having received nothing."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from tests.conftest import RUN_ID, TEST_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


class Canary:
    """A TCP server on every host address that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def host_canary() -> Iterator[Canary]:
    """A canary on the host listening on all addresses (so on each bridge's gateway address too)."""
    canary = Canary()
    yield canary
    canary.close()


# prints one line per connection it accepts
CANARY_SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(8); print("listening", flush=True)
while True:
    c, a = s.accept(); print("canary accepted", a, flush=True); c.close()
"""


@pytest.fixture
def net_canary(docker_client: Any) -> Iterator[tuple[str, Any]]:
    """A canary container (TCP 8080, logs each connection) on a test network of its own."""
    network = docker_client.networks.create(f"sbx-{RUN_ID}-canary", labels={TEST_LABEL: RUN_ID})
    container = docker_client.containers.run(
        "sandbox-exec:latest",
        ["python3", "-u", "-c", CANARY_SERVER],
        name=f"sbx-{RUN_ID}-canary",
        detach=True,
        network=network.name,
        labels={TEST_LABEL: RUN_ID},
    )
    for _ in range(100):  # until it listens
        if b"listening" in container.logs():
            break
        time.sleep(0.05)
    container.reload()
    ip = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
    yield ip, container
    container.remove(force=True)
    network.remove()


def connect_from(docker_client: Any, container_id: str, host: str, port: int) -> int:
    """Open a TCP connection from inside a container (socat); its exit code (0 = connected)."""
    result = docker_client.containers.get(container_id).exec_run(
        ["socat", "-u", "OPEN:/dev/null", f"TCP:{host}:{port},connect-timeout=3"]
    )
    return int(result.exit_code)


def two_tenant_config(make_config: Any, tmp_path: Path) -> Any:
    return make_config(f"""
tools: {{sandbox: {{tools: {{also_allow: [browser]}}}}}}
agents:
  defaults: {{sandbox: {{mode: all, scope: agent, browser: {{enabled: true}}}}}}
  list:
    - {{id: a, tenant: ta, workspace: "{tmp_path / "wa"}"}}
    - {{id: b, tenant: tb, workspace: "{tmp_path / "wb"}"}}
""")


async def test_browsers_of_two_tenants_are_isolated(
    make_config: Any, tmp_path: Path, docker_client: Any, host_canary: Canary, net_canary: tuple[str, Any]
) -> None:
    """Tenant A's browser reaches neither tenant B's CDP, nor the host (via its gateway), nor another
    network; the orchestrator still drives both over CDP."""
    async with Orchestrator(two_tenant_config(make_config, tmp_path)) as orch:
        ea = await orch.session("agent:a:s1").browser()
        eb = await orch.session("agent:b:s1").browser()
        assert ea.network != eb.network and ea.host_firewall and eb.host_firewall
        for endpoint in (ea, eb):
            with urllib.request.urlopen(f"{endpoint.cdp_url}/json/version", timeout=5) as response:
                assert "Browser" in json.loads(response.read())
            net = docker_client.api.inspect_network(endpoint.network)
            assert net["Internal"] is True and list(net["Containers"]) == [endpoint.container_id]
        b_ip = eb.cdp_url.removeprefix("http://").split(":")[0]
        a_net = docker_client.api.inspect_network(ea.network)
        gateway = a_net["IPAM"]["Config"][0]["Gateway"]
        canary_ip, canary = net_canary

        assert connect_from(docker_client, ea.container_id, b_ip, 9222) != 0  # B's CDP
        assert connect_from(docker_client, ea.container_id, gateway, host_canary.port) != 0  # the host
        assert connect_from(docker_client, ea.container_id, canary_ip, 8080) != 0  # another network
        assert host_canary.accepted == 0
        assert "canary accepted" not in canary.logs().decode()

        # the canaries are live: the host reaches its own canary, the canary's own network reaches it
        with socket.create_connection(("127.0.0.1", host_canary.port), timeout=3):
            pass
        assert _wait_accept(host_canary)
        probe = docker_client.containers.get(canary.id).exec_run(
            ["python3", "-c", f"import socket; socket.create_connection(('{canary_ip}', 8080), timeout=3)"]
        )
        # the connect returns once the kernel queues it; the canary logs after its accept(), so wait for that
        assert probe.exit_code == 0 and _wait_logged(canary, "canary accepted")


def _wait_logged(container: Any, line: str) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if line in container.logs().decode():
            return True
        time.sleep(0.05)
    return False


def _wait_accept(canary: Canary) -> bool:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if canary.accepted:
            return True
        time.sleep(0.05)
    return False


async def test_unused_browser_networks_and_rules_are_removed(make_config: Any, docker_client: Any) -> None:
    """When a browser sandbox is gone, its network (and host firewall rules) go at the next start."""
    from sandbox.runtime.docker import hostfirewall

    config = make_config("""
tools: {sandbox: {tools: {also_allow: [browser]}}}
agents: {defaults: {sandbox: {mode: all, scope: session, browser: {enabled: true}}}}
""")
    async with Orchestrator(config) as orch:
        first = await orch.session("agent:main:one").browser()
        bridge = docker_client.api.inspect_network(first.network)["Options"]["com.docker.network.bridge.name"]
        assert hostfirewall.rules_present(bridge)
        docker_client.api.remove_container(first.container_id, force=True)
        second = await orch.session("agent:main:two").browser()
        assert second.network != first.network
        assert not docker_client.networks.list(names=[first.network])
        assert not hostfirewall.rules_present(bridge)
