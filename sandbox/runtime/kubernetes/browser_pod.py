"""A browser sandbox as a Pod: pure, so the tests and `sandbox k8s pod` see what the backend makes.

The browser image (images/browser) runs Chromium headless with its DevTools port relayed on the
Pod's own address; the orchestrator reaches that port through the API server's port forwarding
(portforward.py), so the deny-all NetworkPolicy stays whole and nothing in the cluster can reach
the browser. With `network: egress` the browser may reach only its proxy: a proxy of its own
policy (the allowlist without the secrets: runtime/browser_rules.py), pinned in its hosts file,
and Chromium resolves no name itself. Restricted like every sandbox Pod; Chromium runs with
`--no-sandbox` (it cannot make its own namespaces without privileges), so the Pod is its sandbox.
"""

from __future__ import annotations

from typing import Any

from sandbox.config.kubernetes import KubernetesSection
from sandbox.config.merge import EffectiveAgent
from sandbox.runtime.egress_proxy import PROXY_PORT
from sandbox.runtime.kubernetes.names import MANAGED_BY, K8sAnnotations, K8sLabels, label_value, policy_hash
from sandbox.runtime.kubernetes.pod import (
    EGRESS_PROXY_HOST,
    NO_RESOLVER,
    SANDBOX_SERVICE_ACCOUNT,
    ProxyRef,
    mebibytes,
    placement,
)

BROWSER_UID = 1000  # the image's user (images/browser/Dockerfile)


def browser_pod(
    agent: EffectiveAgent,
    name: str,
    scope_key: str,
    session: str,
    instance: str,
    cfg: KubernetesSection,
    namespace: str,
    *,
    proxy: ProxyRef | None = None,
    policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The browser Pod of one scope key (`proxy` and `policy`: its egress proxy, `network: egress` only)."""
    browser = agent.sandbox.browser
    docker = agent.sandbox.docker
    resources = {
        "cpu": f"{int(docker.cpus * 1000)}m",
        "memory": mebibytes(docker.memory),
        "ephemeral-storage": cfg.scratch_size,
    }
    labels = {
        MANAGED_BY[0]: MANAGED_BY[1],
        # listed with the sandboxes (kind browser), so `sandbox list`, prune and recreate see it
        K8sLabels.SANDBOX: "true",
        K8sLabels.INSTANCE: instance,
        K8sLabels.KIND: "browser",
        K8sLabels.TENANT: label_value(agent.tenant),
        K8sLabels.AGENT: label_value("shared" if agent.id == "*" else agent.id),
        K8sLabels.SCOPE: agent.sandbox.scope,
    }
    env = [{"name": "CDP_PORT", "value": str(browser.cdp_port)}]
    extra: dict[str, Any] = {}
    if proxy is not None and policy is not None:
        labels[K8sLabels.EGRESS] = policy_hash(policy)  # what lets it reach that proxy (tenant.py)
        env.append({"name": "PROXY_SERVER", "value": f"{EGRESS_PROXY_HOST}:{PROXY_PORT}"})
        extra["hostAliases"] = [{"ip": proxy.ip, "hostnames": [EGRESS_PROXY_HOST]}]
    # Chromium's profile and caches in memory, as Docker's tmpfs mounts (counted in its memory)
    volumes = [
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "512Mi"}},
        {"name": "home", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}},
    ]
    container = {
        "name": "browser",
        "image": browser.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "env": env,
        "ports": [{"containerPort": browser.cdp_port, "protocol": "TCP"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "home", "mountPath": "/home/browser"},
        ],
    }
    spec = {
        "serviceAccountName": SANDBOX_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": [NO_RESOLVER]},
        "hostname": "browser",
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": BROWSER_UID,
            "runAsGroup": BROWSER_UID,
            "fsGroup": BROWSER_UID,
            # Chromium under the node's default profile, as Docker runs it under the engine's
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
        **extra,
        **placement(cfg),
    }
    annotations = {
        K8sAnnotations.TENANT: agent.tenant,
        K8sAnnotations.SESSION: session if agent.sandbox.scope == "session" else "",
        K8sAnnotations.SCOPE_KEY: scope_key,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": spec,
    }
