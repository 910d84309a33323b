"""What only a real cluster can answer (scripts/k8s-e2e runs this with KUBECONFIG set; here, with
no API server installable, every test is skipped and says so): Pod Security admission accepts
the rendered Pod and rejects a mutated one, deny-all really blocks, the memory limit holds, the
ephemeral-storage limit holds (the kubelet evicts), and gVisor runs the sandbox when the cluster
has it. The egress proxy path is test_cluster_egress.py, the warm pool race
test_cluster_pool_race.py; what they share is cluster.py and conftest.py.

A check whose answer depends on something the cluster may lack (local storage accounting, a
gVisor RuntimeClass) skips with the reason rather than fail for it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from sandbox.config import effective_agent
from sandbox.config.kubernetes import quantity_bytes
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.kubernetes.pod import sandbox_pod
from sandbox.runtime.spec import spec_from_config
from tests.contract import cluster
from tests.contract.cluster import kubectl

pytestmark = cluster.needs_cluster


def test_admission_accepts_the_rendered_pod_and_rejects_a_mutated_one(prepared: Any) -> None:
    pod = cluster.pod(prepared, "agent:main:adm")
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
        pod = cluster.pod(prepared, "agent:main:net")
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
    pod = cluster.pod(prepared, "agent:main:mem")
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


# -- the ephemeral-storage check's program and waits ----------------------------------------

# random blocks: a compressing filesystem cannot make them smaller than what was written
FILL = """
import os, sys
block = os.urandom(1 << 20)
with open(sys.argv[1], "wb") as out:
    for _ in range(int(sys.argv[2])):
        out.write(block)
    out.flush()
    os.fsync(out.fileno())
print("wrote", sys.argv[2], "MiB", flush=True)
"""
# the kubelet checks limits every 10 s, but measures an emptyDir's usage about once a minute
# (volumeStatsAggPeriod): an eviction comes within ~75 s; this leaves room for a busy node
EVICTION_WAIT_S = 180
# the kubelet's eviction messages for a Pod over its own limits (pkg/kubelet/eviction/helpers.go);
# a node low on disk says "The node was low on resource" instead, which is not this check's answer
OVER_ITS_LIMIT = ("Usage of EmptyDir volume", "ephemeral local storage usage exceeds", "local ephemeral storage limit")


@pytest.mark.timeout(600)
def test_the_ephemeral_storage_limit_holds(prepared: Any) -> None:
    cfg = prepared.runtime.kubernetes
    namespace = namespace_for(cfg, "acme")
    pod = cluster.pod(prepared, "agent:main:disk")
    name = pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]
    # the writes go to the workspace, which is the Pod's disk-backed scratch (an emptyDir with no
    # medium, under the scratch size); the memory emptyDirs (tmpfs) count as memory, not here
    scratch = next(v for v in pod["spec"]["volumes"] if v["name"] == "workspace")
    assert scratch == {"name": "workspace", "emptyDir": {"sizeLimit": cfg.scratch_size}}, scratch
    assert {"name": "workspace", "mountPath": "/workspace", "readOnly": False} in container["volumeMounts"]
    assert container["resources"]["limits"]["ephemeral-storage"] == cfg.scratch_size
    mebibytes = quantity_bytes(cfg.scratch_size) * 3 // 2 // 1024**2  # half as much again as allowed
    assert kubectl("apply", "-f", "-", stdin=json.dumps(pod)).returncode == 0
    try:
        assert cluster.ready(namespace, name), cluster.events(namespace, name)
        node = cluster.kubectl_json("get", "node", cluster.field(namespace, "pod", name, "{.spec.nodeName}")) or {}
        if "ephemeral-storage" not in (node.get("status") or {}).get("capacity", {}):
            pytest.skip(
                "the node reports no ephemeral-storage capacity: its kubelet runs without local storage isolation"
            )
        fill = kubectl(
            "-n", namespace, "exec", name, "--", "python3", "-c", FILL, "/workspace/e2e-fill", str(mebibytes)
        )
        if "No space left" in fill.stdout + fill.stderr:
            pytest.skip(
                f"the node's disk has less than {mebibytes} MiB free, so the limit cannot be passed: {fill.stderr}"
            )
        status: dict[str, Any] = {}
        deadline = time.monotonic() + EVICTION_WAIT_S
        while time.monotonic() < deadline:
            status = (cluster.kubectl_json("-n", namespace, "get", "pod", name) or {}).get("status") or {}
            if status.get("phase") in ("Failed", "Succeeded"):
                break
            time.sleep(5)
        message = str(status.get("message", ""))
        if "node was low on resource" in message:
            pytest.skip(f"the node ran out of disk before the Pod passed its own limit: {message}")
        # evicted by the kubelet for passing its own limit, not failed for another reason
        evicted = status.get("phase") == "Failed" and status.get("reason") == "Evicted"
        assert evicted and any(words in message for words in OVER_ITS_LIMIT), (status, fill)
    finally:
        kubectl("-n", namespace, "delete", "pod", name, "--grace-period=0", "--ignore-not-found")


@pytest.mark.timeout(600)
def test_gvisor_runs_the_sandbox_when_the_cluster_has_it(prepared: Any) -> None:
    found = kubectl("get", "runtimeclass", "gvisor", "-o", "json")
    if found.returncode != 0:
        pytest.skip(f"the cluster has no RuntimeClass gvisor ({found.stderr.strip()})")
    runtime_class = json.loads(found.stdout)
    handler, scheduling = runtime_class.get("handler"), runtime_class.get("scheduling")
    namespace = namespace_for(prepared.runtime.kubernetes, "acme")
    cfg = prepared.runtime.kubernetes.model_copy(update={"runtime_class_name": "gvisor"})
    spec = spec_from_config(prepared, effective_agent(prepared, "main"), "agent:main:gvisor", "e2e")
    pod = sandbox_pod(spec, cfg, namespace)
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    name = pod["metadata"]["name"]
    assert kubectl("apply", "-f", "-", stdin=json.dumps(pod)).returncode == 0
    try:
        if not cluster.ready(namespace, name):
            events = cluster.events(namespace, name)
            # the class is there but no node can run it: the handler is not in the node's runtime
            # (containerd: no runtime for "runsc"; CRI-O: RuntimeHandler), or no node has its labels
            if any(words in events.lower() for words in ("no runtime for", "runtimehandler", "runtime handler")):
                pytest.skip(f"RuntimeClass gvisor names handler {handler!r}, which the node's runtime lacks: {events}")
            if scheduling and "FailedScheduling" in events:
                pytest.skip(f"no node has what RuntimeClass gvisor schedules onto ({scheduling}): {events}")
            pytest.fail(f"the gVisor sandbox Pod did not become ready: {events}")

        def inside(*argv: str) -> str:
            return kubectl("-n", namespace, "exec", name, "--", *argv).stdout.strip()

        release, version, dmesg = inside("uname", "-r"), inside("cat", "/proc/version"), inside("dmesg")
        node = cluster.kubectl_json("get", "node", cluster.field(namespace, "pod", name, "{.spec.nodeName}")) or {}
        kernel = ((node.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion")
        # not the node's kernel, and gVisor's own: its boot log, or the kernel version it reports
        assert release and release != kernel, (release, kernel, version)
        assert "Starting gVisor" in dmesg or release == "4.4.0", (release, version, dmesg[:500])
    finally:
        kubectl("-n", namespace, "delete", "pod", name, "--grace-period=0", "--ignore-not-found")
