"""What a live Pod says of itself, read back from the API: whether it is one this orchestrator
would adopt, why it is not running, and what list and facts report of it."""

from __future__ import annotations

from typing import Any

from sandbox.config.kubernetes import quantity_bytes
from sandbox.runtime.kubernetes.names import MANAGED_BY, K8sAnnotations, K8sLabels
from sandbox.runtime.kubernetes.pss import violations
from sandbox.runtime.naming import Labels
from sandbox.runtime.protocol import SandboxFacts, SandboxInfo
from sandbox.runtime.spec import Mount, SandboxSpec


def adoptable(pod: dict[str, Any], spec: SandboxSpec, expected: dict[str, Any]) -> bool:
    """Whether a running Pod of `spec`'s name is the one this orchestrator would make: its labels
    (managed, this instance, this config), restricted, and the fields that decide what it can do
    equal to the rendered Pod's. A Pod planted under the name (loose RBAC, another controller) is
    not handed the session's commands, environment and files."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (
        labels.get(MANAGED_BY[0]) == MANAGED_BY[1]
        and labels.get(K8sLabels.INSTANCE) == spec.instance
        and labels.get(K8sLabels.CONFIG_HASH) == spec.config_hash
        and same_shape(pod, expected)
    )


def claimable(pod: dict[str, Any], spec: SandboxSpec, expected: dict[str, Any], key: str) -> bool:
    """Whether a listed warm pool Pod may be handed to `spec`'s session: one of this instance's
    unclaimed members of pool `key`, of `spec`'s tenant, ready, and of the shape the session's own
    Pod would have (`expected`). A Pod planted with the pool's labels (loose RBAC, another
    controller) is never claimed, nor one that is not serving yet."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    ready = [c.get("ready") for c in (pod.get("status") or {}).get("containerStatuses") or []]
    return (
        labels.get(MANAGED_BY[0]) == MANAGED_BY[1]
        and labels.get(K8sLabels.INSTANCE) == spec.instance
        and labels.get(K8sLabels.POOL) == key
        and labels.get(K8sLabels.CLAIMED) == "false"
        and (meta.get("annotations") or {}).get(K8sAnnotations.TENANT) == spec.tenant
        and bool(ready)
        and all(ready)
        and same_shape(pod, expected)
    )


def same_shape(pod: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether a live Pod runs, restricted, with the fields that decide what it can do (account,
    runtime class, user, image, args, security contexts, volumes) equal to the rendered Pod's."""
    if (
        (pod.get("metadata") or {}).get("deletionTimestamp")
        or (pod.get("status") or {}).get("phase") != "Running"
        or violations(pod, "restricted", "v1.33")
    ):
        return False
    live, want = pod.get("spec") or {}, expected["spec"]
    for key in ("serviceAccountName", "automountServiceAccountToken", "enableServiceLinks", "runtimeClassName"):
        if live.get(key) != want.get(key):
            return False
    if any(live.get(key) for key in ("hostNetwork", "hostPID", "hostIPC")):
        return False
    if live.get("securityContext", {}).get("runAsUser") != want["securityContext"]["runAsUser"]:
        return False
    # init containers too: one could have written the agent the sandbox is driven by (agent_copy.py)
    for field in ("containers", "initContainers"):
        live_boxes, want_boxes = live.get(field) or [], want.get(field) or []
        if len(live_boxes) != len(want_boxes):
            return False
        for got, wanted in zip(live_boxes, want_boxes, strict=True):
            for key in ("image", "command", "args", "securityContext"):
                if got.get(key) != wanted.get(key):
                    return False
            if _mounts(got) != _mounts(wanted):
                return False

    def kinds(spec_volumes: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {
            (
                v.get("name", ""),
                str((v.get("persistentVolumeClaim") or {}).get("claimName") or sorted(set(v) - {"name"})),
            )
            for v in spec_volumes
        }

    return kinds(live.get("volumes") or []) == kinds(want.get("volumes") or [])


def _mounts(container: dict[str, Any]) -> list[dict[str, Any]]:
    """A container's mounts without false or empty fields (the API server omits `readOnly: false`)."""
    return [{k: v for k, v in m.items() if v not in (False, None, "")} for m in container.get("volumeMounts") or []]


def why_not_running(pod: dict[str, Any] | None) -> str:
    """What a Pod's status says about why it is not running (the first container's waiting reason)."""
    if pod is None:
        return "it is gone"
    status = pod.get("status") or {}
    init = [(f"init step {c.get('name')}: ", c) for c in status.get("initContainerStatuses") or []]
    for step, container in init + [("", c) for c in status.get("containerStatuses") or []]:
        state = container.get("state") or {}
        for key in ("waiting", "terminated"):
            if key == "terminated" and (state.get(key) or {}).get("exitCode") == 0:
                continue  # an init step that passed says nothing of why the Pod does not run
            if state.get(key):
                detail = state[key]
                return f"{step}{detail.get('reason', key)}: {detail.get('message', '')}".rstrip(": ")
    return str(status.get("message") or status.get("reason") or status.get("phase") or "no status yet")


def info_of(pod: dict[str, Any]) -> SandboxInfo:
    """A Pod as the engine-neutral listing has it. A claimed pool Pod is listed under the sandbox
    name of its session (its id stays the Pod's name); the pool and creation time are also under
    the engine-neutral label keys, so the pool and prune code read them as on Docker."""
    meta = pod.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    notes = meta.get("annotations") or {}
    scope = labels.get(K8sLabels.SCOPE, "")
    if labels.get(K8sLabels.POOL):
        labels[Labels.POOL] = labels[K8sLabels.POOL]
    labels[Labels.CREATED_AT] = str(meta.get("creationTimestamp") or "")
    return SandboxInfo(
        id=meta.get("name", ""),
        name=notes.get(K8sAnnotations.SANDBOX_NAME) or meta.get("name", ""),
        kind=labels.get(K8sLabels.KIND, "exec"),
        instance=labels.get(K8sLabels.INSTANCE, ""),
        tenant=notes.get(K8sAnnotations.TENANT, ""),
        agent=labels.get(K8sLabels.AGENT, ""),
        scope=scope,
        scope_key=notes.get(K8sAnnotations.SCOPE_KEY, ""),
        session=notes.get(K8sAnnotations.SESSION, "") if scope == "session" else "",
        config_hash=labels.get(K8sLabels.CONFIG_HASH, ""),
        created_at=str(meta.get("creationTimestamp") or ""),
        status=str((pod.get("status") or {}).get("phase") or "unknown").lower(),
        image=str(((pod.get("spec") or {}).get("containers") or [{}])[0].get("image", "")),
        labels=labels,
    )


def facts_of(name_or_id: str, pod: dict[str, Any]) -> SandboxFacts:
    """A Pod as the facts `sandbox demo` and audits show."""
    spec = pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    security = container.get("securityContext") or {}
    pod_security = spec.get("securityContext") or {}
    limits = (container.get("resources") or {}).get("limits") or {}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    mounts = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"], {})
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        source = f"claim {claim}" if claim else f"emptyDir {mount['name']}"
        mounts.append(Mount(source, mount["mountPath"], bool(mount.get("readOnly")), "the API", volume=True))
    labels = (pod.get("metadata") or {}).get("labels") or {}
    seccomp = (pod_security.get("seccompProfile") or {}).get("type", "unset")
    return SandboxFacts(
        name=name_or_id,
        id=str((pod.get("metadata") or {}).get("uid") or name_or_id),
        image=str(container.get("image", "")),
        user=f"{pod_security.get('runAsUser')}:{pod_security.get('runAsGroup')}",
        network="egress proxy only" if labels.get(K8sLabels.EGRESS) else "none (deny-all NetworkPolicy)",
        cap_drop=tuple((security.get("capabilities") or {}).get("drop") or ()),
        security_opt=(
            f"allowPrivilegeEscalation={security.get('allowPrivilegeEscalation')}",
            f"seccomp={seccomp}",
            f"runtimeClassName={spec.get('runtimeClassName') or 'default'}",
        ),
        read_only_root=bool(security.get("readOnlyRootFilesystem")),
        pids_limit=None,
        memory=quantity_bytes(str(limits.get("memory", "0"))),
        nano_cpus=int(str(limits.get("cpu", "0")).rstrip("m") or 0) * 1_000_000,
        init=None,
        mounts=tuple(mounts),
    )
