"""The fake cluster's agent-sandbox controller (tests/k8s_fake_cluster.py): what
kubernetes-sigs/agent-sandbox does with a SandboxClaim, in the small. A claim of a warm pool gets
a Sandbox of the claim's name whose `agents.x-k8s.io/pod-name` annotation names the Pod it
adopted (made here from the template's podTemplate, with the claim's additional Pod metadata),
and the claim's `status.sandbox.name`; deleting the claim (shutdownPolicy Delete) deletes both.
What it does not do: keep the warm pool's own Pods, or watch templates for changes."""

from __future__ import annotations

import copy
import secrets
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.k8s_fake_cluster import FakeCluster

KINDS = ("sandboxtemplates", "sandboxwarmpools", "sandboxclaims", "sandboxes")
POD_NAME = "agents.x-k8s.io/pod-name"


async def claimed(cluster: FakeCluster, namespace: str, claim: dict[str, Any]) -> None:
    """Give a new claim its Sandbox and Pod (from its warm pool's template), if they exist."""
    pool = cluster.objects.get(("sandboxwarmpools", namespace, claim["spec"]["warmPoolRef"]["name"]))
    if pool is None:
        return
    template = cluster.objects.get(("sandboxtemplates", namespace, pool["spec"]["sandboxTemplateRef"]["name"]))
    if template is None:
        return
    pod_template = copy.deepcopy(template["spec"]["podTemplate"])
    meta = pod_template.get("metadata") or {}
    extra = (claim["spec"].get("additionalPodMetadata") or {}).get("annotations") or {}
    pod_name = f"{pool['metadata']['name'][:40]}-{secrets.token_hex(4)}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "labels": dict(meta.get("labels") or {}),
            "annotations": {**(meta.get("annotations") or {}), **extra},
        },
        "spec": pod_template["spec"],
    }
    await cluster.add("pods", namespace, pod)
    sandbox = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": claim["metadata"]["name"], "annotations": {POD_NAME: pod_name}},
        "spec": {},
    }
    await cluster.add("sandboxes", namespace, sandbox)
    claim["status"] = {"sandbox": {"name": claim["metadata"]["name"]}}
    cluster.changed("sandboxclaims", namespace, claim)


async def released(cluster: FakeCluster, namespace: str, claim: dict[str, Any]) -> None:
    """shutdownPolicy Delete: the claim's Sandbox and its Pod go with it."""
    sandbox = cluster.objects.pop(("sandboxes", namespace, claim["metadata"]["name"]), None)
    if sandbox is None:
        return
    pod = sandbox["metadata"]["annotations"].get(POD_NAME, sandbox["metadata"]["name"])
    found = cluster.objects.pop(("pods", namespace, pod), None)
    if found is not None:
        cluster.changed("pods", namespace, found, "DELETED")
        await cluster.stop_pod(namespace, pod)
