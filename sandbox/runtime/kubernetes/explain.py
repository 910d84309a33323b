"""What `explain` says about the Pod a sandboxed session maps to on Kubernetes (from the config:
no cluster is asked)."""

from __future__ import annotations

from typing import Any

from sandbox.config.merge import EffectiveAgent
from sandbox.config.models import Config
from sandbox.errors import SandboxError
from sandbox.policy.resolver import ResolvedPolicy
from sandbox.runtime.kubernetes.exec_ws import V4, V5
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.kubernetes.pod import ProxyRef, sandbox_pod, workspace_claim_name
from sandbox.runtime.kubernetes.proxy_ca import ca_placeholder
from sandbox.runtime.naming import instance_id
from sandbox.runtime.spec import spec_from_config

PROXY_PLACEHOLDER = "192.0.2.1"  # TEST-NET-1: never an address anything is sent to
EXEC_PATH = (
    f"the resident agent over one pods/exec websocket ({V5} offered first; an API server older than "
    f"1.30 lets the kubelet answer {V4}, which cannot close stdin: the stream then ends only with "
    "its socket)"
)


def pod_facts(config: Config, policy: ResolvedPolicy, *, agent: EffectiveAgent | None = None) -> dict[str, Any]:
    """The Pod's name, namespace, hardening and workspace, or why it cannot be made."""
    k8s = config.runtime.kubernetes
    try:
        spec = spec_from_config(
            config, agent or policy.agent, policy.session.raw, instance_id(config.state_dir, config.instance)
        )
        namespace = namespace_for(k8s, spec.tenant)
        # the proxy's address is the cluster's to give; explain needs only the rest of the Pod
        proxy = ProxyRef(PROXY_PLACEHOLDER, ca_placeholder(spec.egress)) if spec.egress is not None else None
        pod = sandbox_pod(spec, k8s, namespace, proxy=proxy)
    except SandboxError as exc:
        return {"error": exc.message}
    container = pod["spec"]["containers"][0]
    claim = workspace_claim_name(spec)
    return {
        "name": spec.name,
        "namespace": namespace,
        "image": spec.image,
        "user": spec.user,
        "runtime_class": pod["spec"].get("runtimeClassName", "the cluster's default"),
        "seccomp": pod["spec"]["securityContext"]["seccompProfile"]["type"],
        "resources": container["resources"]["limits"],
        "network": "its namespace's egress proxy only" if spec.egress is not None else "none (deny-all NetworkPolicy)",
        "workspace": f"claim {claim} ({spec.workspace_access})" if claim else f"scratch emptyDir ({k8s.scratch_size})",
        "pod_security": f"restricted, {k8s.pss_version}",
        "exec_path": EXEC_PATH,
    }


def pod_text(facts: dict[str, Any]) -> str:
    """The human rendering of :func:`pod_facts`."""
    if "error" in facts:
        return f"pod        cannot be made: {facts['error']}"
    limits = ", ".join(f"{k} {v}" for k, v in facts["resources"].items())
    return "\n".join(
        [
            f"pod        {facts['namespace']}/{facts['name']} (Pod Security {facts['pod_security']})",
            f"           image {facts['image']}, user {facts['user']}, runtime class {facts['runtime_class']}, "
            f"seccomp {facts['seccomp']}",
            f"           limits {limits}; network {facts['network']}",
            f"workspace  {facts['workspace']}",
            f"exec       {facts['exec_path']}",
        ]
    )
