"""The browser on a cluster: a restricted browser Pod per scope key, its DevTools reached through
the API server's port forwarding (the Pod's network stays deny-all), and with `network: egress`
a proxy of its own policy (the allowlist, never the secrets). Rendering and the forwarding
protocol's refusals without an engine; the browser tool end to end on the fake cluster, whose
Pods are real containers."""

from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest

from sandbox.config import load_config_text
from sandbox.config.merge import effective_agent
from sandbox.config.models import Config
from sandbox.engine.orchestrator import Orchestrator
from sandbox.runtime.browser_rules import browser_egress_policy
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.browser_pod import browser_pod
from sandbox.runtime.kubernetes.exec_ws import ExecRefused
from sandbox.runtime.kubernetes.names import K8sLabels, namespace_for, policy_hash
from sandbox.runtime.kubernetes.pod import ProxyRef
from sandbox.runtime.kubernetes.portforward import LocalForward, open_forward, portforward_url
from sandbox.runtime.kubernetes.pss import violations
from sandbox.runtime.kubernetes.tenant import Orchestrator as RoleSubject
from sandbox.runtime.kubernetes.tenant import tenant_objects
from sandbox.runtime.spec import egress_policy
from tests.conftest import RUN_ID, TEST_LABEL
from tests.egress_lab import Lab
from tests.k8s_egress_lab import start_proxy
from tests.k8s_fake_cluster import FakeCluster
from tests.k8s_helpers import one_agent_config

pytestmark = pytest.mark.anyio
SECRETS = "secrets: {API_TOKEN: {value_from: 'env:SBX_TEST_BROWSER_SECRET', hosts: [allowed.test]}}"


def _config(tmp_path: Path, *, egress: str = "", instance: str = "br1") -> Config:
    network = f", docker: {{network: egress}}, egress: {{{egress}}}" if egress else ""
    sandbox = f"{{mode: all, scope: session, workspace_access: rw, browser: {{enabled: true}}{network}}}"
    (tmp_path / "ws").mkdir(exist_ok=True)
    return load_config_text(
        f"""
state_dir: {tmp_path / "state"}
instance: {instance}
runtime:
  backend: kubernetes
  kubernetes: {{pod_ready_timeout_s: 60, seccomp: "Localhost:agent-sandbox/strict.json"}}
tenants: [{{id: acme}}]
tools: {{sandbox: {{tools: {{also_allow: [browser]}}}}}}
agents:
  list:
    - {{id: main, tenant: acme, default: true, workspace: {tmp_path / "ws"}, sandbox: {sandbox}}}
""",
        base_dir=tmp_path,
    )


@pytest.mark.parametrize("version", ["1.33", "1.37"])
def test_the_browser_pod_is_restricted_and_valid(tmp_path: Path, version: str) -> None:
    config = _config(tmp_path, egress=f"allow: [allowed.test], {SECRETS}")
    agent = effective_agent(config, "main")
    policy = browser_egress_policy(agent)
    assert policy is not None and policy["secrets"] == []  # the browser's proxy never holds a value
    pod = browser_pod(
        agent, "sbx-b", "agent:main:s", "agent:main:s", "br1", config.runtime.kubernetes, "ns",
        proxy=ProxyRef("10.96.0.8"), policy=policy,
    )  # fmt: skip
    kubernetes_validate.validate(pod, version, strict=True)
    assert violations(pod, "restricted", f"v{version}") == []
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["dnsPolicy"] == "None"
    assert spec["hostAliases"] == [{"ip": "10.96.0.8", "hostnames": ["egress-proxy"]}]
    assert pod["metadata"]["labels"][K8sLabels.EGRESS] == policy_hash(policy) != policy_hash(egress_policy(agent))
    assert "API_TOKEN" not in str(pod)
    # the tenant gets that proxy too, and the Role may forward ports (only because a browser is on)
    objects = tenant_objects(config, config.tenants[0], RoleSubject())
    names = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"}
    assert names == {f"proxy-{policy_hash(policy)}", f"proxy-{policy_hash(egress_policy(agent))}"}
    role = next(o for o in objects if o["kind"] == "Role")
    assert {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get", "create"]} in role["rules"]
    plain = one_agent_config(tmp_path, "br2", "{mode: all, scope: session}")
    plain_role = next(o for o in tenant_objects(plain, plain.tenants[0], RoleSubject()) if o["kind"] == "Role")
    assert not [r for r in plain_role["rules"] if "pods/portforward" in r["resources"]]


# -- the forwarding protocol against the fake API, relayed to a server on this host ------------


@pytest.fixture
async def echo_cluster() -> AsyncIterator[tuple[FakeCluster, int]]:
    """A fake API whose Pod `web` forwards to an echo server on this host's loopback."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    # the relay ends once the echo server has closed its side (after our end of input): its
    # reader thread has forwarded the last bytes then
    relay = f"import socket,sys,threading;s=socket.create_connection(('127.0.0.1',{port}))\n" + (
        "t=threading.Thread(target=lambda:[sys.stdout.buffer.write(b) or sys.stdout.buffer.flush() "
        "for b in iter(lambda:s.recv(65536),b'')],daemon=True);t.start()\n"
        "[s.sendall(b) for b in iter(lambda:sys.stdin.buffer.read1(65536),b'')]\ns.shutdown(socket.SHUT_WR)\n"
        "t.join(10)"
    )
    import threading

    def echo() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(b"echo:" + data)

    threading.Thread(target=echo, daemon=True).start()
    async with FakeCluster(namespaces={"ns"}) as fake:
        fake.objects[("pods", "ns", "web")] = {"metadata": {"name": "web", "namespace": "ns"}}
        fake.forward_command = lambda namespace, pod, p: [sys.executable, "-c", relay]  # type: ignore[method-assign, assignment]
        yield fake, port
    server.close()


async def _through(forward: LocalForward, payload: bytes) -> bytes:
    import anyio

    async with await anyio.connect_tcp("127.0.0.1", forward.port) as stream:
        await stream.send(payload)
        got = b""
        with anyio.move_on_after(5):
            while len(got) < len(payload) + 5:
                try:
                    got += await stream.receive()
                except anyio.EndOfStream:
                    break
        return got


async def test_a_local_connection_is_carried_to_the_pods_port(echo_cluster: tuple[FakeCluster, int]) -> None:
    fake, port = echo_cluster
    async with aiohttp.ClientSession() as http:
        url = portforward_url(fake.url, "ns", "web", port)
        headers = {"Authorization": f"Bearer {fake.token}"}
        forward = LocalForward(lambda: open_forward(http, url, port, headers=headers), "web")
        await forward.start()
        try:
            assert await _through(forward, b"hello") == b"echo:hello"
            assert await _through(forward, b"again") == b"echo:again"  # a websocket per connection
        finally:
            await forward.aclose()
        assert not forward.serving
    assert sum(1 for m, p in fake.requests if p.endswith("/portforward")) == 2


@pytest.mark.parametrize("fault", ["wrong-port", "error", "unknown-channel", "no-token", "no-pod"])
async def test_a_hostile_or_refusing_forward_carries_nothing(echo_cluster: tuple[FakeCluster, int], fault: str) -> None:
    """A first frame naming another port, an error on the error channel, a channel that does not
    exist, a refused upgrade: the local connection closes with nothing from the stream."""
    fake, port = echo_cluster
    token = "bad" if fault == "no-token" else fake.token
    pod = "absent" if fault == "no-pod" else "web"
    if fault not in ("no-token", "no-pod"):
        fake.portforward_fault = fault
    async with aiohttp.ClientSession() as http:
        url = portforward_url(fake.url, "ns", pod, port)
        if fault in ("wrong-port", "no-token", "no-pod"):
            with pytest.raises(ExecRefused) as refused:
                await open_forward(http, url, port, headers={"Authorization": f"Bearer {token}"})
            if fault == "no-token":
                assert "pods/portforward" in refused.value.message
        forward = LocalForward(lambda: open_forward(http, url, port, headers={"Authorization": f"Bearer {token}"}), pod)
        await forward.start()
        try:
            assert await _through(forward, b"hello") == b""
        finally:
            await forward.aclose()


# -- the browser tool end to end -------------------------------------------------------------


@pytest.mark.docker
async def test_the_browser_tool_runs_in_a_browser_pod_reached_by_port_forwarding(
    tmp_path: Path, docker_client: Any, images: None
) -> None:
    """No network: a screenshot through CDP proves the path; the Pod goes with the session."""
    config = _config(tmp_path, instance=f"{RUN_ID}b")
    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, RUN_ID)) as cluster:
        cluster.namespaces.add(namespace_for(config.runtime.kubernetes, "acme"))
        async with Orchestrator(config, KubernetesBackend(config, api=cluster.api()), journal=False) as orch:
            session = orch.session(agent="main", key="agent:main:b1")
            shot = await session.call("browser", {"action": "screenshot"})
            assert shot.ok, shot.error
            assert shot.output["bytes"] > 1000
            # the screenshot is in the workspace, which the session's sandbox Pod has
            seen = await session.call("exec", {"command": f"head -c 4 {shot.output['path']} | od -An -c"})
            assert seen.output["output"].split() == ["211", "P", "N", "G"], seen.output
            browser = orch.browsers().name_for(effective_agent(config, "main"), session.key)
            pods = sorted(k[2] for k in cluster.objects if k[0] == "pods")
            assert browser in pods and len(pods) == 2  # the browser's Pod and the sandbox's
            listed = {i.name: i.kind for i in await orch.manager.list()}
            assert listed[browser] == "browser"  # listed, so prune and `recreate --browser` see it
            forwards = [p for m, p in cluster.requests if p.endswith("/portforward")]
            assert forwards  # DevTools came through the API server, not the Pod's network
            await session.close()
        assert [k for k in cluster.objects if k[0] == "pods"] == []


@pytest.mark.docker
async def test_the_browser_reaches_an_allowed_page_through_its_own_proxy(
    tmp_path: Path, lab: Lab, docker_client: Any, images: None, pod_network: tuple[str, str]
) -> None:
    network, proxy_ip = pod_network
    egress = f"allow: [allowed.test], ports: [8000], allow_private: ['{lab.web_ip}/32']"
    config = _config(tmp_path, egress=egress, instance=f"{RUN_ID}p")
    agent = effective_agent(config, "main")
    policy = browser_egress_policy(agent)
    assert policy is not None
    digest = policy_hash(policy)
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, RUN_ID), pod_network=network) as cluster:
        cluster.namespaces.add(namespace)
        service = {"metadata": {"name": f"proxy-{digest}", "namespace": namespace}, "spec": {"clusterIP": proxy_ip}}
        cluster.objects[("services", namespace, f"proxy-{digest}")] = service
        backend = KubernetesBackend(config, api=cluster.api())
        # the browser's proxy Secret is written when its Pod is made; then the proxy can start
        await backend.browsers(f"{RUN_ID}p").ensure(agent, "agent:main:b2", browser_allowed=True)
        start_proxy(docker_client, cluster, config, lab, network, proxy_ip, tmp_path, digest)
        async with Orchestrator(config, backend, journal=False) as orch:
            session = orch.session(agent="main", key="agent:main:b2")
            went = await session.call("browser", {"action": "navigate", "url": "http://allowed.test:8000/page"})
            assert went.ok, went.error
            assert went.output["title"] == "t"
            off = await session.call("browser", {"action": "navigate", "url": "http://canary.test:8000/"})
            assert not off.ok and off.error.code == "PERMISSION_DENIED", off
            await session.close()
    assert lab.canary_heard() == []
