"""What the checks only a real cluster can answer share (tests/contract/test_cluster_*.py; run by
scripts/k8s-e2e with KUBECONFIG set): the skip marker that leaves them out without a cluster,
kubectl and small readers of what it says (a field, an object as JSON, a Pod's readiness, logs
and events), the configs and Pods the checks make, and a probe of whether the cluster's CNI
enforces NetworkPolicy at all. The tenant objects every check relies on are the `prepared`
fixture (tests/contract/conftest.py)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.config import effective_agent, load_config_text
from sandbox.config.models import Config
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.kubernetes.pod import sandbox_pod
from sandbox.runtime.spec import spec_from_config

# each test file's `pytestmark`: nothing here can stand in for a cluster
needs_cluster = pytest.mark.skipif(
    not (os.environ.get("SANDBOX_K8S_E2E") and os.environ.get("KUBECONFIG")),
    reason="needs a Kubernetes cluster (scripts/k8s-e2e with KUBECONFIG)",
)


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=300)


def pod(config: Any, session: str) -> dict[str, Any]:
    spec = spec_from_config(config, effective_agent(config, "main"), session, "e2e")
    return sandbox_pod(spec, config.runtime.kubernetes, namespace_for(config.runtime.kubernetes, "acme"))


LISTENER = """
import socket
server = socket.socket()
server.bind(("0.0.0.0", 8080))
server.listen()
print("LISTENING", flush=True)
while True:
    conn, peer = server.accept()
    print("HEARD", peer[0], flush=True)
    conn.close()
"""


def config(tmp: Path, instance: str, tenant: str, sandbox: dict[str, Any]) -> Config:
    """A config of one agent `main` of `tenant` whose sandbox is `sandbox` over the defaults the
    checks share (every session sandboxed, session scope, a scratch workspace)."""
    data = {
        "state_dir": str(tmp / "state"),
        "instance": instance,
        "runtime": {"backend": "kubernetes", "kubernetes": {"seccomp": "Localhost:agent-sandbox/strict.json"}},
        "tenants": [{"id": tenant}],
        "agents": {
            "defaults": {"sandbox": {"mode": "all", "scope": "session", "workspace_access": "none"}},
            "list": [{"id": "main", "tenant": tenant, "workspace": str(tmp / "ws"), "sandbox": sandbox}],
        },
    }
    return load_config_text(yaml.safe_dump(data), base_dir=tmp)


def apply(*objects: dict[str, Any]) -> None:
    applied = kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    assert applied.returncode == 0, applied.stderr


def kubectl_json(*args: str) -> dict[str, Any] | None:
    found = kubectl(*args, "-o", "json")
    return json.loads(found.stdout) if found.returncode == 0 else None


def field(namespace: str, kind: str, name: str, path: str) -> str:
    return kubectl("-n", namespace, "get", kind, name, "-o", f"jsonpath={path}").stdout.strip()


def ready(namespace: str, name: str, seconds: int = 120) -> bool:
    return (
        kubectl("-n", namespace, "wait", "--for=condition=Ready", f"pod/{name}", f"--timeout={seconds}s").returncode
        == 0
    )


def accepts_pods(namespace: str, seconds: float = 30) -> bool:
    """Whether a namespace's `default` ServiceAccount is there: a Pod naming no account is refused
    until the controller made it, which it does just after the namespace."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if kubectl("-n", namespace, "get", "serviceaccount", "default").returncode == 0:
            return True
        time.sleep(1)
    return False


def settled(namespace: str, name: str, seconds: float = 30) -> bool:
    """Whether a Pod's resourceVersion stays put for 3 s (its kubelet done reporting its start)."""
    deadline = time.monotonic() + seconds
    last = ""
    while time.monotonic() < deadline:
        now = field(namespace, "pod", name, "{.metadata.resourceVersion}")
        if now and now == last:
            return True
        last = now
        time.sleep(3)
    return False


def logged(namespace: str, name: str, text: str, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if text in kubectl("-n", namespace, "logs", name).stdout:
            return True
        time.sleep(1)
    return False


def heard(namespace: str, name: str) -> list[str]:
    """The addresses a LISTENER Pod (or the egress check's WEB_SERVER) was reached from, one per
    request."""
    lines = kubectl("-n", namespace, "logs", name).stdout.splitlines()
    return [line.split()[1] for line in lines if line.startswith("HEARD ")]


def events(namespace: str, name: str) -> str:
    """What the cluster said about one object (scheduling, sandbox creation, pulls), for messages."""
    found = kubectl_json("-n", namespace, "get", "events", "--field-selector", f"involvedObject.name={name}")
    return "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in (found or {}).get("items", []))


def plain_pod(name: str, namespace: str, labels: dict[str, str], command: list[str]) -> dict[str, Any]:
    """A small Pod of a check's own (a server, a probe; not a sandbox), restricted so that every
    namespace admits it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": name,
                    "image": "sandbox-exec:latest",
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "100m", "memory": "128Mi"},
                    },
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def network_policy_enforced() -> bool | None:
    """Whether this cluster's CNI enforces NetworkPolicy at all, asked with nothing of the
    product's: in a namespace of its own, a listener behind the probe's own policy denying it all
    ingress, and a client trying it. True: refused or dropped; False: it connected; None: the
    probe itself did not work, so it cannot tell."""
    namespace = f"e2e-netpol-{secrets.token_hex(4)}"
    deny = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny-ingress", "namespace": namespace},
        "spec": {"podSelector": {"matchLabels": {"e2e": "listener"}}, "policyTypes": ["Ingress"]},
    }
    objects = [
        deny,
        plain_pod("listener", namespace, {"e2e": "listener"}, ["python3", "-u", "-c", LISTENER]),
        plain_pod("client", namespace, {"e2e": "client"}, ["sleep", "infinity"]),
    ]
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    try:
        if kubectl("create", "namespace", namespace).returncode != 0 or not accepts_pods(namespace):
            return None
        if kubectl("apply", "-f", "-", stdin=listed).returncode != 0:
            return None
        if not (ready(namespace, "listener") and ready(namespace, "client")):
            return None
        if not logged(namespace, "listener", "LISTENING"):
            return None
        address = field(namespace, "pod", "listener", "{.status.podIP}")
        probe = f"import socket; socket.create_connection(('{address}', 8080), timeout=5); print('CONNECTED')"
        tried = kubectl("-n", namespace, "exec", "client", "--", "python3", "-c", probe)
        if "CONNECTED" in tried.stdout:
            return False
        if any(word in tried.stderr for word in ("timed out", "refused", "No route to host")):
            return True
        return None
    finally:
        kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
