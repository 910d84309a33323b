"""`provider: agent-sandbox`, driven: a session's sandbox is a SandboxClaim of the agent's
SandboxWarmPool (agent_sandbox.py renders them); its Pod is the one the claim's Sandbox adopted.

The backend creates the SandboxTemplate and SandboxWarmPool of a sandbox configuration (once;
existing ones are kept), then the session's claim, named after the session's sandbox. The
provider's controller binds the claim to a Sandbox (`status.sandbox.name`), whose
`agents.x-k8s.io/pod-name` annotation names the Pod it took from the pool (else the Pod has the
Sandbox's name). That Pod is used only when it is running, ready, and of the shape this
orchestrator renders (pods_read.same_shape): the controller, or anyone who may write the
template, cannot hand a session some other Pod. Removing the sandbox deletes the claim; the
claim's `shutdownPolicy: Delete` takes its Sandbox and Pod.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from sandbox.errors import SandboxUnavailable
from sandbox.runtime.kubernetes.agent_sandbox import GROUP, provider_objects
from sandbox.runtime.kubernetes.names import K8sAnnotations
from sandbox.runtime.kubernetes.pod import ProxyRef
from sandbox.runtime.kubernetes.pods_read import same_shape
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.kubernetes.backend import KubernetesBackend

SANDBOXES = "agents.x-k8s.io/v1beta1"
POD_NAME = "agents.x-k8s.io/pod-name"
PLURALS = {
    "SandboxTemplate": "sandboxtemplates",
    "SandboxWarmPool": "sandboxwarmpools",
    "SandboxClaim": "sandboxclaims",
}
POLL_S = 0.2


async def claim_exists(backend: KubernetesBackend, namespace: str, name: str) -> bool:
    """Whether the session's SandboxClaim exists."""
    status, _ = await (await backend.api()).custom("get", GROUP, "sandboxclaims", namespace, name)
    return status != 404


async def claimed_pod(backend: KubernetesBackend, spec: SandboxSpec, namespace: str, proxy: ProxyRef | None) -> str:
    """The Pod of `spec`'s claim (made when missing), once it runs as rendered; its name.

    Raises:
        SandboxUnavailable: the claim was not bound, or its Pod did not run, within
            `pod_ready_timeout_s`, or its Pod is not the one rendered (the claim is then deleted).
    """
    api = await backend.api()
    pool_size = backend.pool_size(spec)
    objects = provider_objects(spec, backend.cfg, namespace, replicas=pool_size, proxy=proxy)
    claim = objects[-1]
    # the session's sandbox name on its Pod, so a listing shows the session (a Pod keeps its name)
    claim["spec"]["additionalPodMetadata"]["annotations"][K8sAnnotations.SANDBOX_NAME] = spec.name
    for obj in objects:
        status, body = await api.custom("create", GROUP, PLURALS[obj["kind"]], namespace, obj)
        if status >= 300 and status != 409:
            raise SandboxUnavailable(f"creating {obj['kind']} {namespace}/{obj['metadata']['name']}: {status} {body}")
    sandbox = await _bound(backend, namespace, spec.name)
    pod_name = str((sandbox.get("metadata") or {}).get("annotations", {}).get(POD_NAME) or spec.name)
    await backend.wait_running(namespace, pod_name)
    pod = await api.get("pods", namespace, pod_name)
    expected = objects[0]["spec"]["podTemplate"]
    if pod is None or not same_shape(pod, expected):
        await api.custom("delete", GROUP, "sandboxclaims", namespace, spec.name)
        raise SandboxUnavailable(
            f"the Pod {namespace}/{pod_name} bound to claim {spec.name} is not the Pod this orchestrator renders "
            "(its SandboxTemplate was changed?); the claim was deleted"
        )
    return pod_name


async def _bound(backend: KubernetesBackend, namespace: str, claim: str) -> dict[str, Any]:
    """The Sandbox the claim is bound to, once the controller bound it."""
    api = await backend.api()
    deadline = time.monotonic() + backend.cfg.pod_ready_timeout_s
    while True:
        status, body = await api.custom("get", GROUP, "sandboxclaims", namespace, claim)
        name = (((body or {}).get("status") or {}).get("sandbox") or {}).get("name") if status == 200 else None
        if name:
            status, sandbox = await api.custom("get", SANDBOXES, "sandboxes", namespace, name)
            if status == 200 and isinstance(sandbox, dict):
                return sandbox
        if time.monotonic() > deadline:
            raise SandboxUnavailable(
                f"the SandboxClaim {namespace}/{claim} was not bound to a Sandbox after "
                f"{backend.cfg.pod_ready_timeout_s:.0f} s: is the agent-sandbox controller running, and its "
                "SandboxWarmPool filled?"
            )
        await anyio.sleep(POLL_S)


async def release(backend: KubernetesBackend, namespace: str, name: str) -> None:
    """Delete the session's claim (its Sandbox and Pod go with it); gone already is fine."""
    await (await backend.api()).custom("delete", GROUP, "sandboxclaims", namespace, name)
