"""What `explain` says about the Pod a sandboxed session maps to on Kubernetes: the Pod from the
config, and from the cluster when it answers within LIVE_TIMEOUT_S (read only: the session's Pod,
the subprotocol its agent's link agreed, the API server's version)."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import anyio

from sandbox.config.kubernetes import KubernetesSection
from sandbox.config.merge import EffectiveAgent
from sandbox.config.models import Config
from sandbox.errors import SandboxError
from sandbox.policy.resolver import ResolvedPolicy
from sandbox.runtime.kubernetes import api as k8s_api
from sandbox.runtime.kubernetes.exec_ws import V4, V5
from sandbox.runtime.kubernetes.names import K8sAnnotations, namespace_for
from sandbox.runtime.kubernetes.pod import ProxyRef, sandbox_pod, workspace_claim_name
from sandbox.runtime.kubernetes.proxy_ca import ca_placeholder
from sandbox.runtime.naming import instance_id
from sandbox.runtime.spec import spec_from_config

LIVE_TIMEOUT_S = 10.0  # the cluster's answers (loading the client is not counted)
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
        "live": live_facts(k8s, namespace, spec.name),
    }


def live_facts(k8s: KubernetesSection, namespace: str, name: str) -> dict[str, str]:
    """What the cluster says of the session's Pod and its link; why it could not be asked, else."""
    try:
        return anyio.run(_ask, k8s, namespace, name)
    except TimeoutError:
        return {"error": f"the cluster did not answer within {LIVE_TIMEOUT_S:g}s"}
    except SandboxError as exc:
        return {"error": exc.message}


async def _ask(k8s: KubernetesSection, namespace: str, name: str) -> dict[str, str]:
    with contextlib.suppress(ImportError):  # loaded before the clock starts: a busy machine is slow at it
        importlib.import_module("kubernetes.aio.client")
    with anyio.fail_after(LIVE_TIMEOUT_S):
        api = await k8s_api.connect(k8s)
        try:
            _, version = await api.call("VersionApi", "reading the version", "get_code")
            pod = await api.get("pods", namespace, name)
        finally:
            await api.close()
    server = str((version or {}).get("gitVersion") or "unknown")
    minor = str((version or {}).get("minor") or "").rstrip("+")
    answers = V5 if minor.isdigit() and int(minor) >= 30 else V4
    facts = {"server": server, "expected": answers}
    if pod is None:
        facts["pod"] = "none yet (made at the session's first sandboxed call)"
        return facts
    facts["pod"] = str((pod.get("status") or {}).get("phase") or "unknown")
    agreed = ((pod.get("metadata") or {}).get("annotations") or {}).get(K8sAnnotations.EXEC_PROTOCOL)
    if agreed:
        facts["agreed"] = str(agreed)
    return facts


def live_text(live: dict[str, str]) -> str:
    """One line of :func:`live_facts`."""
    if "error" in live:
        return f"live       the cluster was not asked: {live['error']}"
    link = f"its link agreed {live['agreed']}" if "agreed" in live else f"no link yet; {live['expected']} expected"
    one_shot = " (v4: the stream ends only with its socket)" if live.get("agreed", live["expected"]) == V4 else ""
    return f"live       API server {live['server']}; Pod {live['pod']}; {link}{one_shot}"


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
            live_text(facts["live"]),
        ]
    )
