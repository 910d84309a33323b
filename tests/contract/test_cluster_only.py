"""What only a real cluster can answer (scripts/k8s-e2e runs this with KUBECONFIG set; here, with
no API server installable, every test is skipped and says so): Pod Security admission accepts
the rendered Pod and rejects a mutated one, deny-all really blocks, the memory limit holds."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.config import effective_agent, load_config_text
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.kubernetes.pod import sandbox_pod
from sandbox.runtime.kubernetes.tenant import Orchestrator, tenant_objects
from sandbox.runtime.spec import spec_from_config

pytestmark = pytest.mark.skipif(
    not (os.environ.get("SANDBOX_K8S_E2E") and os.environ.get("KUBECONFIG")),
    reason="needs a Kubernetes cluster (scripts/k8s-e2e with KUBECONFIG)",
)


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    config = load_config_text(
        f"state_dir: {tmp / 'state'}\ninstance: e2e\n"
        "runtime: {backend: kubernetes, kubernetes: {seccomp: 'Localhost:agent-sandbox/strict.json'}}\n"
        "tenants: [{id: acme}]\n"
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: session}}}}, list: [{{id: main, tenant: acme, workspace: {tmp / 'ws'}}}]}}\n",
        base_dir=tmp,
    )
    objects = tenant_objects(config, config.tenants[0], Orchestrator())
    applied = kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    assert applied.returncode == 0, applied.stderr
    return config


def _pod(config: Any, session: str) -> dict[str, Any]:
    spec = spec_from_config(config, effective_agent(config, "main"), session, "e2e")
    return sandbox_pod(spec, config.runtime.kubernetes, namespace_for(config.runtime.kubernetes, "acme"))


def test_admission_accepts_the_rendered_pod_and_rejects_a_mutated_one(prepared: Any) -> None:
    pod = _pod(prepared, "agent:main:adm")
    accepted = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    assert accepted.returncode == 0, accepted.stderr
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    refused = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    assert refused.returncode != 0 and "PodSecurity" in refused.stderr, refused.stderr


def test_deny_all_blocks_a_sandbox_and_the_canary_hears_nothing(prepared: Any) -> None:
    namespace = namespace_for(prepared.runtime.kubernetes, "acme")
    canary = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "e2e-canary", "namespace": namespace, "labels": {"e2e": "canary"}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "canary",
                    "image": "sandbox-exec:latest",
                    "imagePullPolicy": "IfNotPresent",
                    "command": [
                        "python3",
                        "-u",
                        "-c",
                        "import socket; s=socket.socket(); s.bind(('0.0.0.0', 8080)); s.listen(); [print('HEARD', s.accept()[1]) for _ in iter(int, 1)]",
                    ],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    assert kubectl("apply", "-f", "-", stdin=json.dumps(canary)).returncode == 0
    try:
        assert (
            kubectl("-n", namespace, "wait", "--for=condition=Ready", "pod/e2e-canary", "--timeout=120s").returncode
            == 0
        )
        address = kubectl("-n", namespace, "get", "pod", "e2e-canary", "-o", "jsonpath={.status.podIP}").stdout
        pod = _pod(prepared, "agent:main:net")
        assert kubectl("apply", "-f", "-", stdin=json.dumps(pod)).returncode == 0
        name = pod["metadata"]["name"]
        assert (
            kubectl("-n", namespace, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s").returncode == 0
        )
        probe = f"import socket; socket.create_connection(('{address}', 8080), timeout=5)"
        tried = kubectl("-n", namespace, "exec", name, "--", "python3", "-c", probe)
        # refused by the network, not by something else going wrong
        assert tried.returncode != 0 and ("timed out" in tried.stderr or "refused" in tried.stderr), tried.stderr
        assert "HEARD" not in kubectl("-n", namespace, "logs", "e2e-canary").stdout
        kubectl("-n", namespace, "delete", "pod", name, "--grace-period=0")
    finally:
        kubectl("-n", namespace, "delete", "pod", "e2e-canary", "--grace-period=0")


def test_the_memory_limit_holds(prepared: Any) -> None:
    namespace = namespace_for(prepared.runtime.kubernetes, "acme")
    pod = _pod(prepared, "agent:main:mem")
    name = pod["metadata"]["name"]
    assert kubectl("apply", "-f", "-", stdin=json.dumps(pod)).returncode == 0
    try:
        assert (
            kubectl("-n", namespace, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s").returncode == 0
        )
        hog = kubectl("-n", namespace, "exec", name, "--", "python3", "-c", "b = bytearray(4 * 1024**3); print('kept')")
        # killed by the OOM killer at the 1 GiB limit (exit 137), not allowed 4 GiB
        assert "kept" not in hog.stdout and (hog.returncode == 137 or "137" in hog.stderr), hog
    finally:
        kubectl("-n", namespace, "delete", "pod", name, "--grace-period=0")
