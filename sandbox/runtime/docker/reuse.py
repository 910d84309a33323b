"""Whether a container found under a spec's name may serve it, or is removed and made again.

Three questions, in order: whose it is (its tenant and scope key, or, for a warm-pool member,
the claim made when it was handed over), whether it is still the spec's (its config hash; what
drifted is named by config key), and whether it still works (running, its egress proxy up, its
bridge's host rules in, its workspace folder the one it was made on).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from sandbox._log import logger
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.docker import egress
from sandbox.runtime.docker.workspace import recorded_id, workspace_lost
from sandbox.runtime.naming import LABEL_PREFIX, Labels
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.docker.backend import DockerBackend

# each hashed config key's own hash, so a drift can say which keys changed
CONFIG_KEYS_LABEL = f"{LABEL_PREFIX}.config-keys"


def key_hashes(hashed: Mapping[str, Any]) -> dict[str, str]:
    """A short hash of each config key's value (the CONFIG_KEYS_LABEL a container is made with)."""
    return {k: hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest()[:8] for k, v in hashed.items()}


def changed_keys(labels: Mapping[str, str], spec: SandboxSpec) -> list[str]:
    """The config keys whose value differs between a container's labels and `spec`."""
    try:
        old = json.loads(labels.get(CONFIG_KEYS_LABEL, "{}"))
    except json.JSONDecodeError:
        old = {}
    new = key_hashes(spec.hashed)
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


async def bridge_guarded(spec: SandboxSpec) -> bool:
    """The egress bridge's host rules are in (restored if something removed them); False only
    where they cannot be and the policy requires them."""
    if not (spec.egress or {}).get("require_host_firewall", True):
        return True  # the operator accepted an egress network without them
    return await anyio.to_thread.run_sync(egress.bridge_guarded, spec.name)


async def reusable(backend: DockerBackend, attrs: Mapping[str, Any], spec: SandboxSpec) -> bool:
    """Whether the container `attrs` (its `docker inspect`) serves `spec` as it is; False: it is
    to be removed and made again (drifted, or no longer working).

    Raises:
        SandboxUnavailable: it belongs to another tenant or scope key (a hash collision, or a
            config that skipped validation): neither handed out nor removed.
    """
    labels = attrs["Config"].get("Labels") or {}
    theirs = (labels.get(Labels.TENANT), labels.get(Labels.SCOPE_KEY))
    config_hash = labels.get(Labels.CONFIG_HASH)
    if labels.get(Labels.POOL):
        # a warm-pool container handed to a session: its labels name no session, the
        # claim made when it was handed over does (runtime/docker/pool.py)
        claim = backend.pool_claims.get(attrs["Id"]) if backend.pool_claims is not None else None
        theirs = (
            (claim.tenant, claim.scope_key)
            if claim is not None and claim.name == spec.name
            else (
                labels.get(Labels.TENANT),
                "(a pool container not handed to this session)",
            )
        )
        config_hash = spec.config_hash if labels[Labels.POOL] == spec.pool_key else "(pool drift)"
    if theirs != (spec.tenant, spec.scope_key):
        raise SandboxUnavailable(
            f"container {spec.name} belongs to tenant {theirs[0]!r}, scope key {theirs[1]!r}, "
            f"not to tenant {spec.tenant!r}, scope key {spec.scope_key!r}; it is left alone",
            container=spec.name,
        )
    status = attrs["State"].get("Status")
    if status == "paused":  # paused while idle (sandbox.idle_pause_s): thawed, then checked as any
        if not await backend.freezer().thaw(spec.name):  # another process thawed it first: look again
            fresh = await backend.find(spec.name)
            status = ((fresh or {}).get("State") or {}).get("Status", status)
        else:
            status = "running"
    running = await _working(backend, status == "running", labels, spec)
    if config_hash == spec.config_hash and running:
        return True
    if config_hash != spec.config_hash:
        logger.bind(container=spec.name, changed=changed_keys(labels, spec)).info("sandbox_config_drift")
    else:
        logger.bind(container=spec.name, status=attrs["State"].get("Status")).info("sandbox_dead")
    return False


async def _working(backend: DockerBackend, running: bool, labels: Mapping[str, str], spec: SandboxSpec) -> bool:
    """A running container whose way out and workspace are still the ones it was made with."""
    if (
        running
        and spec.egress is not None
        and not await backend.call("inspect egress proxy", egress.proxy_running, backend.client, spec.name)
    ):
        logger.bind(container=spec.name).info("sandbox_egress_proxy_gone")
        running = False  # its only way out is gone: remade with a new proxy
    if running and spec.egress is not None and not await bridge_guarded(spec):
        running = False  # its bridge reaches the host: remade, or refused where rules cannot be put in
    if running and await anyio.to_thread.run_sync(workspace_lost, recorded_id(labels), spec):
        logger.bind(container=spec.name, workspace=spec.workspace.source).warning("sandbox_workspace_gone")
        running = False  # its bind holds a removed folder: made again on a workspace made again
    return running
