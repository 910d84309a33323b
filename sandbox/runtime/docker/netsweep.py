"""Networks this instance made and nothing uses any more: found by their labels and removed.

Two kinds: an egress edge (proxy and network) whose sandbox or browser is gone, and a browser's
own network with no container on it. Only networks carrying this instance's label and one of
these kinds are ever touched: another instance's, a user's, or an unlabelled network never is.
A network another live process may be filling right now (younger than the grace period and not
made by this process) is left for the next sweep.

Called at start-up (`cleanup_orphans`), by `sandbox prune`, and when a container is removed
(`remove_networks_of`: its own network goes with it, so `recreate --browser` leaves none).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import docker.errors

from sandbox._log import logger
from sandbox.journal.owners import current_owner
from sandbox.runtime.docker import egress, hostfirewall
from sandbox.runtime.docker.subnets import age_s
from sandbox.runtime.naming import CREATOR_LABEL, Labels

BROWSER_NETWORK_KIND = "browser-net"  # runtime/docker/browser.py's networks


def _mine(labels: dict[str, str]) -> bool:
    creator = str(labels.get(CREATOR_LABEL, ""))
    return creator in (current_owner(), f"{socket.gethostname()}:{os.getpid()}")


def sweep_orphans(client: Any, instance: str) -> list[str]:
    """Remove this instance's edges whose container is gone and its unused browser networks;
    the names removed. Blocking."""
    return _sweep_edges(client, instance) + sweep_orphan_networks(client, instance)


def _sweep_edges(client: Any, instance: str) -> list[str]:
    removed = []
    filters = {"label": [f"{Labels.KIND}={egress.PROXY_KIND}", f"{Labels.INSTANCE}={instance}"]}
    proxies = client.api.containers(all=True, filters=filters)
    networks = client.api.networks(
        filters={"label": [f"{Labels.KIND}={egress.NETWORK_KIND}", f"{Labels.INSTANCE}={instance}"]}
    )
    owners = {str((p.get("Labels") or {}).get(egress.SANDBOX_LABEL, "")): p for p in proxies}
    for net in networks:
        owners.setdefault(str((net.get("Labels") or {}).get(egress.SANDBOX_LABEL, "")), net)
    for sandbox_name, item in owners.items():
        if not sandbox_name or sandbox_name in egress.MAKING:
            continue  # this process is making its sandbox right now
        try:
            client.api.inspect_container(sandbox_name)
            continue  # its sandbox is there
        except docker.errors.NotFound:
            pass
        if not _mine(item.get("Labels") or {}) and age_s(item.get("Created")) < egress.ORPHAN_GRACE_S:
            # another process (maybe on another host, or in a container: its pid says nothing
            # here) may be making its sandbox right now
            continue
        if egress.remove_edge(client, sandbox_name):
            removed.append(egress.names(sandbox_name).proxy)
            logger.bind(sandbox=sandbox_name).info("egress_orphan_removed")
    return removed


def sweep_orphan_networks(client: Any, instance: str) -> list[str]:
    """Remove this instance's browser networks that no container is on (past the grace period,
    or made by this process); the names removed. Blocking."""
    removed = []
    filters = {"label": [f"{Labels.KIND}={BROWSER_NETWORK_KIND}", f"{Labels.INSTANCE}={instance}"]}
    for summary in client.api.networks(filters=filters):
        labels = summary.get("Labels") or {}
        if labels.get(Labels.INSTANCE) != instance:
            continue
        if not _mine(labels) and age_s(summary.get("Created")) < egress.ORPHAN_GRACE_S:
            continue
        if _remove_if_unused(client, str(summary.get("Id") or summary.get("Name"))):
            removed.append(str(summary.get("Name")))
            logger.bind(network=summary.get("Name")).info("network_orphan_removed")
    return removed


def _remove_if_unused(client: Any, network: str) -> bool:
    try:
        attrs = client.api.inspect_network(network)
    except docker.errors.NotFound:
        return False
    if attrs.get("Containers"):
        return False
    bridge = str((attrs.get("Options") or {}).get("com.docker.network.bridge.name", ""))
    try:
        client.api.remove_network(attrs["Id"])
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError:
        return False  # a container joined meanwhile
    if bridge:
        hostfirewall.remove_rules(bridge)
    return True


def remove_networks_of(client: Any, attrs: dict[str, Any]) -> None:
    """After a container is removed: its egress edge, or its own browser network when no other
    container is on it. Blocking."""
    mode = str((attrs.get("HostConfig") or {}).get("NetworkMode") or "")
    name = str(attrs.get("Name", "")).lstrip("/")
    if mode == egress.names(name).network:  # its proxy and network go with it
        egress.remove_edge(client, name)
        return
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    if labels.get(Labels.KIND) != "browser" or not mode:
        return
    try:
        network = client.api.inspect_network(mode)
    except docker.errors.NotFound:
        return
    net_labels = network.get("Labels") or {}
    if net_labels.get(Labels.KIND) == BROWSER_NETWORK_KIND and net_labels.get(Labels.INSTANCE) == labels.get(
        Labels.INSTANCE
    ):
        _remove_if_unused(client, str(network["Id"]))
