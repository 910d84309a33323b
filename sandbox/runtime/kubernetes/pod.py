"""A sandbox spec as a Pod (and its workspace claim): pure, so `sandbox k8s pod` prints exactly
what the backend would create, and the Pod Security checker (pss.py) reads the same objects.

Every Pod is made to pass Pod Security Standards `restricted`: non-root, no privilege
escalation, all capabilities dropped, seccomp set, only claim/emptyDir volumes (never hostPath),
no service account token, no service links, no resolver, requests equal to limits. A setting
that cannot be honoured that way (a host bind, an added capability, a Docker network) is an
error naming the key, never a weaker Pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.config.binds import CONTAINER_WORKDIR
from sandbox.config.kubernetes import KubernetesSection
from sandbox.errors import ConfigError
from sandbox.fs.quota import parse_size
from sandbox.runtime.egress_proxy import PROXY_PORT
from sandbox.runtime.egress_secrets import CA_BUNDLE, CA_VARIABLES
from sandbox.runtime.kubernetes.agent_copy import agent_volume, copied, copy_step
from sandbox.runtime.kubernetes.names import (
    MANAGED_BY,
    K8sAnnotations,
    K8sLabels,
    claim_name,
    label_value,
    policy_hash,
)
from sandbox.runtime.kubernetes.proxy_ca import bundle_step, bundle_volume, decrypts
from sandbox.runtime.kubernetes.proxy_secret import placeholders
from sandbox.runtime.seccomp import STRICT
from sandbox.runtime.spec import SandboxSpec

SANDBOX_SERVICE_ACCOUNT = "sbx-sandbox"  # made per namespace (tenant.py), never given a token
# restricted allows adding only this one capability
RESTRICTED_ADDABLE = frozenset({"NET_BIND_SERVICE"})
# no resolver: `dnsPolicy: None` needs one nameserver, so it is loopback, where nothing answers
NO_RESOLVER = "127.0.0.1"
EGRESS_PROXY_HOST = "egress-proxy"  # the proxy Service's address, pinned by hostAliases


@dataclass(frozen=True)
class ProxyRef:
    """Where an egress sandbox's proxy is on the cluster: its Service's ClusterIP (pinned in the
    Pod's hosts file: the Pod has no resolver) and its CA certificate, which the sandbox trusts
    for the secrets' hosts ("" when the proxy decrypts nothing: kubernetes/proxy_ca.py)."""

    ip: str
    ca_pem: str = ""


# run by the `protect` init container as the sandbox's user, on the workspace claim: makes each
# protected path (an empty file or folder, as on Docker) so the subPath mounts that follow mount
# what it is and never a folder in a file's place; a link on the way refuses the Pod, since the
# kubelet would mount what the link points at
PROTECT_SCRIPT = """
import os, stat, sys
root = sys.argv[1]
def refuse(rel, why):
    sys.exit(f"protected path {rel!r}: {why}; the sandbox cannot start until it is fixed in the workspace")
for item in sys.argv[2:]:
    kind, rel = item.split(":", 1)
    parts = rel.split("/")
    path = root
    for index, name in enumerate(parts):
        path = os.path.join(path, name)
        last = index == len(parts) - 1
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            if last and kind == "file":
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
            else:
                os.mkdir(path, 0o755)
            continue
        if stat.S_ISLNK(info.st_mode):
            refuse(rel, f"{path} is a symbolic link (the mount would follow it); remove it")
        if not last and not stat.S_ISDIR(info.st_mode):
            refuse(rel, f"{path} is not a folder, so nothing below it can be mounted; rename it")
        if last and not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            refuse(rel, f"{path} is neither a file nor a folder; remove it")
        if last and stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            refuse(rel, f"{path} has another name (a hard link) that would stay writable; remove the other")
"""


def mebibytes(size: str) -> str:
    """A size in this config's form as a quantity the API keeps as written (`1g` -> `1024Mi`)."""
    return f"{max(parse_size(size) // (1024 * 1024), 1)}Mi"


def _uid_gid(user: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)(?::(\d+))?", user)
    if match is None:
        raise ConfigError(
            [f"sandbox.docker.user: {user!r} must be numeric uid[:gid] on kubernetes (runAsUser takes numbers)"]
        )
    uid = int(match.group(1))
    return uid, int(match.group(2) or uid)


def refusals(spec: SandboxSpec, cfg: KubernetesSection) -> list[str]:
    """What in `spec` a restricted Pod cannot honour, or would honour only by weakening what the
    config asked for silently, one located line each (empty: none)."""
    d = spec.docker
    found: list[str] = []
    uid, gid = _uid_gid(spec.user)
    if uid == 0 or gid == 0:
        found.append("sandbox.docker.user: uid or gid 0 is refused on kubernetes (runAsNonRoot, fsGroup)")
    if d.seccomp_profile == STRICT and not cfg.seccomp.startswith("Localhost:"):
        found.append(
            "sandbox.docker.seccomp_profile: strict (the default) is this project's own profile; on a cluster it "
            "must be on the nodes: install what `sandbox k8s seccomp` prints in the kubelet's seccomp folder and set "
            "runtime.kubernetes.seccomp: Localhost:<its path>, or choose the runtime's weaker default with "
            "sandbox.docker.seccomp_profile: default"
        )
    if d.runtime and not cfg.runtime_class_name:
        found.append(
            f"sandbox.docker.runtime: {d.runtime!r} has no meaning on a cluster; set "
            "runtime.kubernetes.runtime_class_name to the RuntimeClass that runs it (e.g. gvisor)"
        )
    if d.ulimits:
        found.append("sandbox.docker.ulimits: a Pod has no per-container ulimits (refused rather than dropped)")
    for mount in spec.mounts[1:]:
        if mount.origin.startswith("skills.dirs"):  # a skill's folder goes to its own Pod, as a ConfigMap
            continue
        found.append(f"{mount.origin}: a host path cannot be mounted on kubernetes (no hostPath, ever)")
    if extra := sorted(set(d.cap_add) - RESTRICTED_ADDABLE):
        found.append(f"sandbox.docker.cap_add: {extra} are refused under restricted (only NET_BIND_SERVICE)")
    if "ALL" not in d.cap_drop:
        found.append("sandbox.docker.cap_drop: must hold ALL under restricted")
    if not d.no_new_privileges:
        found.append("sandbox.docker.no_new_privileges: false is refused under restricted")
    if d.network not in ("none", "egress"):
        found.append(
            f"sandbox.docker.network: {d.network!r} is a Docker network; on kubernetes a sandbox has "
            "none (deny-all NetworkPolicy) or egress (through its namespace's proxy)"
        )
    if d.dns or d.extra_hosts:
        found.append("sandbox.docker.dns / extra_hosts: a sandbox Pod has no resolver and no host entries")
    if d.setup_as_root:
        found.append("sandbox.docker.setup_as_root: nothing runs as root in a restricted Pod")
    return found


def _tmpfs_volumes(tmpfs: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Docker's tmpfs mounts as memory-backed emptyDirs with the same size (counted in memory)."""
    volumes, mounts = [], []
    for index, (target, options) in enumerate(sorted(tmpfs.items())):
        size = next((o.split("=", 1)[1] for o in options.split(",") if o.startswith("size=")), "64m")
        name = f"tmp-{index}"
        volumes.append({"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": mebibytes(size)}})
        mounts.append({"name": name, "mountPath": target})
    return volumes, mounts


def workspace_claim_name(spec: SandboxSpec) -> str | None:
    """The claim a spec's workspace lives on (None: scratch on an emptyDir, `workspace_access: none`)."""
    if spec.workspace_access == "none":
        return None
    return claim_name(spec.tenant, spec.agent)


def workspace_claim(spec: SandboxSpec, cfg: KubernetesSection, namespace: str) -> dict[str, Any] | None:
    """The PersistentVolumeClaim of a spec's workspace, or None when it has none.

    ReadWriteOnce from `storage_class`; the shared scope's claim is mounted by many Pods at once,
    so it is ReadWriteMany from `shared_storage_class`.
    """
    name = workspace_claim_name(spec)
    if name is None:
        return None
    shared = spec.scope == "shared"
    klass = cfg.shared_storage_class if shared else cfg.storage_class
    claim: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                MANAGED_BY[0]: MANAGED_BY[1],
                K8sLabels.TENANT: label_value(spec.tenant),
                K8sLabels.AGENT: label_value("shared" if spec.agent == "*" else spec.agent),
            },
            "annotations": {K8sAnnotations.TENANT: spec.tenant},
        },
        "spec": {
            "accessModes": ["ReadWriteMany" if shared else "ReadWriteOnce"],
            "resources": {"requests": {"storage": cfg.workspace_size}},
        },
    }
    if klass is not None:
        claim["spec"]["storageClassName"] = klass
    return claim


def _pod_security(spec: SandboxSpec, cfg: KubernetesSection) -> dict[str, Any]:
    uid, gid = _uid_gid(spec.user)
    seccomp: dict[str, Any] = {"type": "RuntimeDefault"}
    if cfg.seccomp.startswith("Localhost:"):
        seccomp = {"type": "Localhost", "localhostProfile": cfg.seccomp.split(":", 1)[1]}
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
        "fsGroup": gid,
        # chown the claim only when its root is not already the group's (not every start)
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": seccomp,
    }


def _container_security(spec: SandboxSpec) -> dict[str, Any]:
    d = spec.docker
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": d.read_only_root,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"], **({"add": sorted(d.cap_add)} if d.cap_add else {})},
    }
    if d.apparmor_profile:  # a profile the operator loaded on the nodes, as on Docker's host
        security["appArmorProfile"] = {"type": "Localhost", "localhostProfile": d.apparmor_profile}
    return security


def _storage(spec: SandboxSpec, cfg: KubernetesSection) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): tmpfs as memory emptyDirs, the workspace (claim or scratch), and the
    protected paths over a writable one."""
    volumes, mounts = _tmpfs_volumes(spec.docker.tmpfs)
    claim = workspace_claim_name(spec)
    read_only = spec.workspace_access == "ro"
    if claim is None:
        volumes.append({"name": "workspace", "emptyDir": {"sizeLimit": cfg.scratch_size}})
    else:
        volumes.append({"name": "workspace", "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}})
    mounts.append({"name": "workspace", "mountPath": CONTAINER_WORKDIR, "readOnly": read_only})
    # protected paths over a writable workspace: the same claim's sub-paths, read-only
    # and each folder between them and the workspace onto itself, so none can be moved aside
    mounts += [
        {"name": "workspace", "mountPath": f"{CONTAINER_WORKDIR}/{p.rel}", "subPath": p.rel, "readOnly": p.read_only}
        for p in spec.protected
    ]
    return volumes, mounts


def _protect_step(spec: SandboxSpec, cfg: KubernetesSection, resources: dict[str, str]) -> dict[str, Any]:
    """The init container that makes the protected paths before their subPath mounts."""
    kinds = [f"{'dir' if p.kind == 'keep' else p.kind}:{p.rel}" for p in spec.protected]
    return {
        "name": "protect",
        "image": spec.image,
        "imagePullPolicy": cfg.image_pull_policy,
        # -I -S and cwd /: nothing of the workspace is on its import path
        "command": ["python3", "-I", "-S", "-c", PROTECT_SCRIPT, CONTAINER_WORKDIR, *kinds],
        "workingDir": "/",
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": _container_security(spec),
        "volumeMounts": [{"name": "workspace", "mountPath": CONTAINER_WORKDIR}],
    }


def _setup_step(spec: SandboxSpec, cfg: KubernetesSection, container: dict[str, Any]) -> dict[str, Any]:
    """`docker.setup_command` as the last init step: the sandbox container's image, user, limits,
    environment and volumes, so what it writes to the workspace and to the Pod's emptyDirs (the
    tmpfs mounts) is there when the sandbox starts. The Pod serves no command before it succeeds;
    when it fails the Pod fails, with the tail of its output as the reason."""
    return {
        "name": "setup",
        "image": spec.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["/bin/sh", "-lc", spec.docker.setup_command],
        "workingDir": CONTAINER_WORKDIR,
        "env": list(container["env"]),
        "resources": dict(container["resources"]),
        "securityContext": _container_security(spec),
        "volumeMounts": list(container["volumeMounts"]),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _labels(spec: SandboxSpec) -> dict[str, str]:
    labels = {
        MANAGED_BY[0]: MANAGED_BY[1],
        K8sLabels.SANDBOX: "true",
        K8sLabels.INSTANCE: spec.instance,
        K8sLabels.KIND: spec.kind,
        K8sLabels.TENANT: label_value(spec.tenant),
        K8sLabels.AGENT: label_value("shared" if spec.agent == "*" else spec.agent),
        K8sLabels.SCOPE: spec.scope,
        K8sLabels.CONFIG_HASH: spec.config_hash,
    }
    if spec.pool_member:  # a warm pool's: no session yet; a claim patches these (kubernetes/pool.py)
        labels |= {K8sLabels.SCOPE: "pool", K8sLabels.POOL: spec.pool_key or "", K8sLabels.CLAIMED: "false"}
    return labels


def placement(cfg: KubernetesSection) -> dict[str, Any]:
    """Where the Pod may run and how its image is pulled (only what the config sets)."""
    found: dict[str, Any] = {}
    if cfg.runtime_class_name:
        found["runtimeClassName"] = cfg.runtime_class_name
    if cfg.node_selector:
        found["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        found["tolerations"] = [_toleration(t.model_dump()) for t in cfg.tolerations]
    if cfg.image_pull_secrets:
        found["imagePullSecrets"] = [{"name": n} for n in cfg.image_pull_secrets]
    return found


def sandbox_pod(
    spec: SandboxSpec,
    cfg: KubernetesSection,
    namespace: str,
    *,
    proxy: ProxyRef | None = None,
    user_of: str | None = None,
) -> dict[str, Any]:
    """The Pod of one sandbox spec, restricted by construction.

    Args:
        spec: the sandbox.
        cfg: `runtime.kubernetes`.
        namespace: the tenant's namespace.
        proxy: the namespace's egress proxy of the spec's policy (`network: egress` only).
        user_of: for a session's own Pod (a uid of its own), the sandbox whose sessions it serves.

    Raises:
        ConfigError: the spec asks for something a restricted Pod cannot do (see :func:`refusals`),
            or an egress sandbox has no proxy (or none with the CA its secrets need).
    """
    if problems := refusals(spec, cfg):
        raise ConfigError(problems)
    d = spec.docker
    # scratch and the writable layer share the ephemeral-storage limit; tmpfs counts in memory
    resources = {"cpu": f"{int(d.cpus * 1000)}m", "memory": mebibytes(d.memory), "ephemeral-storage": cfg.scratch_size}
    volumes, mounts = _storage(spec, cfg)
    labels = _labels(spec)
    if user_of is not None:
        labels[K8sLabels.USER_OF] = label_value(user_of)
    container: dict[str, Any] = {
        "name": "sandbox",
        "image": spec.image,
        "imagePullPolicy": cfg.image_pull_policy,
        # args, not command: the image's entrypoint (tini in sandbox-exec) stays PID 1 and reaps
        # orphans, as `docker.init` does on Docker
        "args": ["sleep", "infinity"],
        "workingDir": CONTAINER_WORKDIR,
        "env": [{"name": k, "value": v} for k, v in sorted(d.env.items())],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": _container_security(spec),
        "volumeMounts": mounts,
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": SANDBOX_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": [NO_RESOLVER]},
        "hostname": "sandbox",
        "restartPolicy": "Never",  # a dead sandbox is gone; the orchestrator makes a new one
        "terminationGracePeriodSeconds": 5,
        "securityContext": _pod_security(spec, cfg),
        "containers": [container],
        "volumes": volumes,
        **placement(cfg),
    }
    init: list[dict[str, Any]] = []
    if spec.egress is not None:
        labels[K8sLabels.EGRESS] = policy_hash(spec.egress)
        if proxy is None:
            raise ConfigError([f"sandbox.docker.network: egress needs the {namespace} egress proxy's address"])
        pod_spec["hostAliases"] = [{"ip": proxy.ip, "hostnames": [EGRESS_PROXY_HOST]}]
        url = f"http://{EGRESS_PROXY_HOST}:{PROXY_PORT}"
        container["env"] += [
            {"name": name, "value": url} for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
        ]
        # each secret's placeholder (the proxy puts the value in: kubernetes/proxy_secret.py)
        marks = placeholders(namespace, policy_hash(spec.egress), spec.egress)
        container["env"] += [{"name": name, "value": mark} for name, mark in sorted(marks.items())]
        if decrypts(spec.egress):  # the proxy decrypts the secrets' hosts: its CA is trusted here
            if not proxy.ca_pem:
                raise ConfigError([f"sandbox.egress.secrets: the {namespace} egress proxy's CA is needed"])
            container["env"] += [{"name": name, "value": CA_BUNDLE} for name in CA_VARIABLES]
            volume, mount = bundle_volume()
            pod_spec["volumes"].append(volume)
            container["volumeMounts"].append(mount)
            security = _container_security(spec)
            init.append(bundle_step(spec.image, cfg.image_pull_policy, proxy.ca_pem, resources, security))
    if copied(spec, cfg):
        volume, mount = agent_volume()
        pod_spec["volumes"].append(volume)
        container["volumeMounts"].append(mount)
        init.append(copy_step(cfg, resources, _container_security(spec)))
    if workspace_claim_name(spec) is not None and spec.protected:
        init.append(_protect_step(spec, cfg, resources))
    if d.setup_command:  # last: the CA, the agent and the protected paths are in place
        init.append(_setup_step(spec, cfg, container))
    if init:
        pod_spec["initContainers"] = init
    annotations = {
        K8sAnnotations.TENANT: spec.tenant,
        K8sAnnotations.SESSION: "" if spec.pool_member else spec.session,
        K8sAnnotations.SCOPE_KEY: "" if spec.pool_member else spec.scope_key,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": spec.name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": pod_spec,
    }


def _toleration(raw: dict[str, Any]) -> dict[str, Any]:
    names = {"toleration_seconds": "tolerationSeconds"}
    return {names.get(k, k): v for k, v in raw.items() if v is not None}
