"""docker-py `containers.create` arguments from a spec: the one place a spec becomes Docker's.

The spec itself (runtime/spec.py) is pure data; reading a seccomp profile file and scanning mounts
for sockets happen here, when a container is about to be made (or shown by explain and audit).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.config.binds import CONTAINER_WORKDIR, refuse_sockets
from sandbox.fs.quota import parse_size
from sandbox.runtime.naming import short_hash
from sandbox.runtime.seccomp import ENGINE_DEFAULT, STRICT, strict_profile_json
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:  # explain and audit read create_kwargs without loading the SDK (test_startup.py)
    import docker
    from docker.models.containers import Container

# containerd's runc v2 shim serves every container whose OCI spec carries the same value here
# from one process (what Kubernetes' pods use); Docker copies HostConfig.Annotations into the
# spec from Engine 24.0 (API 1.43) and ignores the field before
SHIM_GROUP = "io.containerd.runc.v2.group"
ANNOTATIONS_API = (1, 43)
# a shim creates and starts its containers one at a time (containerd 1.6's runc v2 shim holds one
# lock over `runc create`): a tenant's sandboxes are spread over this many shims, so a burst of
# its new sessions is made this many at a time (bench/scale.py: 300 made 8 at a time took 1.5x
# as long with one shim per tenant)
SHIM_SHARDS = 4


def create_kwargs(spec: SandboxSpec) -> dict[str, Any]:
    """docker-py `containers.create` keyword arguments: the hardened defaults, made explicit.

    Raises:
        BindRefused: a mount holds a Unix socket (a bounded scan, run whenever a container is made).
    """
    d = spec.docker
    refuse_sockets([m.source for m in spec.engine_mounts], d)
    security = []
    if d.no_new_privileges:
        security.append("no-new-privileges:true")
    if d.seccomp_profile == STRICT:
        security.append(f"seccomp={strict_profile_json()}")
    elif d.seccomp_profile and d.seccomp_profile != ENGINE_DEFAULT:
        profile = d.seccomp_profile
        if profile != "unconfined" and os.path.isfile(profile):
            profile = Path(profile).read_text()
        security.append(f"seccomp={profile}")
    if d.apparmor_profile:
        security.append(f"apparmor={d.apparmor_profile}")
    memory = parse_size(d.memory)
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "name": spec.name,
        "command": ["sleep", "infinity"],
        "detach": True,
        "hostname": "sandbox",
        "user": spec.user,
        "working_dir": CONTAINER_WORKDIR,
        "environment": dict(d.env),
        "labels": spec.labels(),
        "network_mode": d.network,
        "cap_drop": list(d.cap_drop),
        "cap_add": list(d.cap_add) or None,
        "security_opt": security,
        "read_only": d.read_only_root,
        "tmpfs": dict(d.tmpfs),
        "pids_limit": d.pids_limit,
        "mem_limit": memory,
        "memswap_limit": parse_size(d.memory_swap) if d.memory_swap else memory,
        "nano_cpus": int(d.cpus * 1e9),
        "init": d.init,
        "restart_policy": {"Name": "no"},
        "dns": list(d.dns) or None,
        "extra_hosts": dict(h.split(":", 1) for h in d.extra_hosts) or None,
        "runtime": d.runtime,
        "healthcheck": health_check(d.health_interval_s),
        "annotations": {SHIM_GROUP: shim_group(spec)} if d.shim == "tenant" else None,
    }
    return {k: v for k, v in kwargs.items() if v is not None}


def shim_group(spec: SandboxSpec) -> str:
    """The shim group of a sandbox: one of SHIM_SHARDS per instance, tenant and runtime (by its
    scope key), never two tenants'. The runtime is part of it so that one shim never drives
    both runc and runsc containers."""
    runtime = spec.docker.runtime or ""
    tenant = short_hash(json.dumps([spec.tenant, runtime]), 24)
    return f"sbx-{spec.instance}-shim-{tenant}-{shim_shard(spec.scope_key)}"


def shim_shard(scope_key: str) -> int:
    """Which of its tenant's SHIM_SHARDS shims a sandbox of `scope_key` joins."""
    return int(short_hash(scope_key, 8), 16) % SHIM_SHARDS


def create_container(client: docker.DockerClient, kwargs: dict[str, Any]) -> Container:
    """`containers.create(**kwargs)`, with what docker-py has no argument for: `annotations`
    (HostConfig.Annotations). The SDK's own conversion of the rest is reused, not redone."""
    from docker.models.containers import _create_container_args

    rest = dict(kwargs)
    annotations = rest.pop("annotations", None)
    if not annotations:
        return client.containers.create(**rest)
    rest["version"] = client.api._version
    rest.setdefault("command", None)
    args = _create_container_args(rest)
    args["host_config"]["Annotations"] = dict(annotations)
    made = client.api.create_container(**args)
    return client.containers.get(made["Id"])


def groups_shims(api_version: str) -> bool:
    """Whether an engine that speaks `api_version` honours the shim group (Engine 24.0+)."""
    try:
        major, minor = (int(part) for part in api_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= ANNOTATIONS_API


def health_check(interval_s: int) -> dict[str, Any]:
    """Docker's health check of a sandbox: none (`NONE`: the image's HEALTHCHECK is off; the
    resident agent's own traffic is the health), or the image's own check every `interval_s`."""
    if not interval_s:
        return {"test": ["NONE"]}
    return {"test": [], "interval": interval_s * 1_000_000_000}  # [] and no timeout: the image's
