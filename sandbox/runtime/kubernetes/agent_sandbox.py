"""`provider: agent-sandbox`: the same restricted Pod as kubernetes-sigs/agent-sandbox objects
(extensions.agents.x-k8s.io/v1beta1): a SandboxTemplate per sandbox kind, a SandboxWarmPool of
them, and a SandboxClaim per session, driven through the API (never through that project's SDK
or router, which needs Pod-network ingress a sandbox must not have).

The template's network policy is `Unmanaged`: the provider's managed default opens egress to
the internet; this project's deny-all (tenant.py) applies instead. Claims may not inject
environment or volume templates (`Disallowed`), which would also force cold starts.
"""

from __future__ import annotations

from typing import Any

from sandbox.config.kubernetes import KubernetesSection
from sandbox.runtime.kubernetes.names import MANAGED_BY, K8sAnnotations, K8sLabels, label_value
from sandbox.runtime.kubernetes.pod import ProxyRef, sandbox_pod
from sandbox.runtime.spec import SandboxSpec

GROUP = "extensions.agents.x-k8s.io/v1beta1"


def template_name(spec: SandboxSpec) -> str:
    """One template per sandbox configuration (its config hash): a changed config is a new one."""
    return f"sbx-{spec.instance}-{spec.config_hash}"


def provider_objects(
    spec: SandboxSpec, cfg: KubernetesSection, namespace: str, *, replicas: int = 0, proxy: ProxyRef | None = None
) -> list[dict[str, Any]]:
    """The template (the rendered Pod inside), the warm pool of `replicas`, and the claim of `spec`.

    Raises:
        ConfigError: what sandbox_pod refuses.
    """
    pod = sandbox_pod(spec, cfg, namespace, proxy=proxy)
    name = template_name(spec)
    labels = {MANAGED_BY[0]: MANAGED_BY[1], K8sLabels.TENANT: label_value(spec.tenant)}
    meta = {"namespace": namespace, "labels": labels, "annotations": {K8sAnnotations.TENANT: spec.tenant}}
    template = {
        "apiVersion": GROUP,
        "kind": "SandboxTemplate",
        "metadata": {"name": name, **meta},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": pod["metadata"]["labels"], "annotations": pod["metadata"]["annotations"]},
                "spec": pod["spec"],
            },
            "networkPolicyManagement": "Unmanaged",
            "envVarsInjectionPolicy": "Disallowed",
            "volumeClaimTemplatesPolicy": "Disallowed",
        },
    }
    pool = {
        "apiVersion": GROUP,
        "kind": "SandboxWarmPool",
        "metadata": {"name": name, **meta},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": name}, "updateStrategy": {"type": "Recreate"}},
    }
    claim = {
        "apiVersion": GROUP,
        "kind": "SandboxClaim",
        "metadata": {"name": spec.name, **meta},
        "spec": {
            "warmPoolRef": {"name": name},
            # the session's end deletes its sandbox; nothing of it is retained
            "lifecycle": {"shutdownPolicy": "Delete"},
            "additionalPodMetadata": {"annotations": {K8sAnnotations.SESSION: spec.session}},
        },
    }
    return [template, pool, claim]


ROLE_RULES = [
    # what the orchestrator does with the provider's objects in a tenant namespace
    {
        "apiGroups": ["extensions.agents.x-k8s.io"],
        "resources": ["sandboxtemplates", "sandboxwarmpools"],
        "verbs": ["get", "list", "create", "update", "patch"],
    },
    {
        "apiGroups": ["extensions.agents.x-k8s.io"],
        "resources": ["sandboxclaims"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["get", "list", "watch"]},
]
