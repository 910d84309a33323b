"""The egress lab on the fake cluster (a pytest plugin, from conftest): the Pods' network (the
fake's "CNI"), and an egress proxy started from its rendered Deployment with the Secrets the
backend wrote, on that network and on the lab's upstream network (tests/egress_lab.py)."""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.runtime.docker import subnets
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.kubernetes.proxy_ca import PROXY_CA_MOUNT
from sandbox.runtime.kubernetes.tenant import Orchestrator as RoleSubject
from sandbox.runtime.kubernetes.tenant import tenant_objects
from tests.conftest import RUN_ID, TEST_LABEL
from tests.egress_lab import Lab
from tests.k8s_fake_cluster import FakeCluster


@pytest.fixture
def pod_network(docker_client: Any) -> Iterator[tuple[str, str]]:
    """An internal network (no way out) for the Pods and the proxy: (its name, the proxy's address)."""
    name = f"sbx-{RUN_ID}-k8s-pods"

    def make(ipam: Any) -> Any:
        return docker_client.networks.create(name, internal=True, ipam=ipam, labels={TEST_LABEL: RUN_ID})

    network = subnets.create_network(docker_client, subnets.DEFAULT_POOL, make)
    network.reload()
    subnet = network.attrs["IPAM"]["Config"][0]["Subnet"]
    proxy_ip = str(list(ipaddress.ip_network(subnet).hosts())[-1])
    try:
        yield name, proxy_ip
    finally:
        network.reload()
        for container_id in network.attrs.get("Containers") or {}:
            docker_client.api.remove_container(container_id, force=True)
        network.remove()


def secret_files(cluster: FakeCluster, namespace: str, name: str) -> dict[str, bytes]:
    found = cluster.objects[("secrets", namespace, name)]
    return {key: base64.b64decode(value) for key, value in found["data"].items()}


def start_proxy(
    docker_client: Any,
    cluster: FakeCluster,
    config: Any,
    lab: Lab,
    network: str,
    proxy_ip: str,
    tmp_path: Path,
    digest: str,
) -> tuple[Any, dict[str, Any]]:
    """The proxy of policy `digest` (tenant acme) as its rendered Deployment runs it, at `proxy_ip`
    on the Pods' network and on the lab's: its Secrets are the ones the backend wrote. (Its
    container, and the proxy's ready line.)"""
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    deployment = next(
        o
        for o in tenant_objects(config, config.tenants[0], RoleSubject())
        if o["kind"] == "Deployment" and o["metadata"]["name"] == f"proxy-{digest}"
    )
    template = deployment["spec"]["template"]["spec"]
    container = template["containers"][0]
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secret_files(cluster, namespace, ref["name"])[ref["key"]].decode()
    # the CA Secret's volume (a proxy with secrets), as the kubelet lays it out: root's files, the
    # proxy's group (fsGroup), 0440
    volumes = {}
    for ca_volume in [v for v in template["volumes"] if "secret" in v]:
        ca_dir = tmp_path / f"proxy-ca-{digest}"
        ca_dir.mkdir()
        for key, content in secret_files(cluster, namespace, ca_volume["secret"]["secretName"]).items():
            path = ca_dir / key
            path.write_bytes(content)
            os.chown(path, 0, int(template["securityContext"]["fsGroup"]))
            os.chmod(path, ca_volume["secret"]["defaultMode"])
        volumes[str(ca_dir)] = {"bind": PROXY_CA_MOUNT, "mode": "ro"}
    security = template["securityContext"]
    # the proxy is a Pod of the fake too (a Deployment's, by its labels), so its log can be read
    pod_name = f"proxy-{digest}-5d8f9-x2k4q"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    cluster.objects[("pods", namespace, pod_name)] = {
        "metadata": {"name": pod_name, "namespace": namespace, "labels": labels, "uid": f"uid-{pod_name}"},
        "status": {"phase": "Running"},
    }
    proxy = docker_client.containers.create(
        container["image"],
        entrypoint=container["command"],
        name=cluster.container_name(namespace, pod_name),
        user=f"{security['runAsUser']}:{security['runAsGroup']}",
        group_add=[str(security.get("fsGroup", security["runAsGroup"]))],
        environment=env,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges:true"],
        tmpfs={"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"},
        volumes=volumes,
        network=lab.network,  # its way out (on a cluster: the NetworkPolicy's egress rule)
        labels={TEST_LABEL: RUN_ID},
    )
    docker_client.api.connect_container_to_network(proxy.id, network, ipv4_address=proxy_ip)
    proxy.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in proxy.logs(stdout=True, stderr=False).splitlines():
            if line.startswith(b'{"egress": 0'):
                return proxy, json.loads(line)
        proxy.reload()
        assert proxy.status in ("created", "running"), proxy.logs().decode(errors="replace")[-800:]
        time.sleep(0.1)
    raise AssertionError(f"the proxy did not start: {proxy.logs().decode(errors='replace')[-800:]}")
