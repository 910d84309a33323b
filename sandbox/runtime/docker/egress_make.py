"""Making a sandbox's egress edge (its internal network and proxy), or adopting one being made.

Makers of one edge take turns: a lock per edge in this process, and across processes the
network's name is the claim (the engine refuses a second network of that name; its loser waits
for the winner's edge and adopts it, re-reading the placeholders from the proxy's policy). Each
network takes a small subnet of the configured pool (runtime/docker/subnets.py), and the proxy runs with
CPU and memory limits and with forwarding off in its network namespace.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import docker.errors

from sandbox._log import logger
from sandbox.errors import SandboxUnavailable
from sandbox.journal.owners import current_owner
from sandbox.runtime import egress_secrets
from sandbox.runtime.docker import hostaddrs, hostfirewall, subnets
from sandbox.runtime.docker.egress import (
    NETWORK_KIND,
    PROXY_KIND,
    PROXY_LOG_CONFIG,
    READY_TIMEOUT_S,
    SANDBOX_LABEL,
    EdgeOwner,
    EgressEdge,
    EgressNames,
    keep_proxy_off_the_host,
    knows_the_host,
    names,
    remove_edge,
)
from sandbox.runtime.egress_proxy import PROXY_MEMORY, PROXY_PORT, proxy_command
from sandbox.runtime.naming import CREATOR_LABEL, LABEL_PREFIX, Labels, short_hash

POLICY_LABEL = f"{LABEL_PREFIX}.egress-policy-hash"  # what the edge enforces (see policy_hash)
PROXY_NANO_CPUS = 1_000_000_000  # one CPU: a busy proxy slows its own sandbox, not the host
# a proxy, not a router: its namespace forwards no packet between its two networks
PROXY_SYSCTLS = {
    "net.ipv4.ip_forward": "0",
    "net.ipv6.conf.all.forwarding": "0",
    "net.ipv6.conf.default.forwarding": "0",
}


def create_edge(client: Any, owner: EdgeOwner) -> EgressEdge:
    """The internal network and the proxy of a sandbox (or browser): one being made by another
    process, or left complete with the same policy, is adopted; a stale one is replaced. Blocking.

    Makers of one edge take turns (a lock per edge in this process; across processes the
    network's name is the claim: the engine refuses a second network of that name, and its
    loser waits for the winner's edge and adopts it).

    Raises:
        SandboxUnavailable: the network or the proxy could not be made or did not come up
            (whatever this call made is removed).
    """
    with _edge_lock(owner.name):
        for _ in range(3):
            adopted = _adopt(client, owner)
            if adopted is not None:
                return adopted
            try:
                return _make_edge(client, owner)
            except _Taken:
                continue  # another process claimed the name first: adopt its edge
    raise SandboxUnavailable("the egress proxy could not be made: its name stayed taken", container=owner.name)


class _Taken(Exception):
    """The edge's network name was claimed by another maker between the look and the create."""


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextmanager
def _edge_lock(name: str) -> Iterator[None]:
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(name, threading.Lock())
    with lock:
        yield
    with _LOCKS_GUARD:
        if not lock.locked() and _LOCKS.get(name) is lock:
            del _LOCKS[name]


def policy_hash(policy: dict[str, Any]) -> str:
    """What an edge enforces, as a label: an edge is adopted only by a maker wanting the same."""
    return short_hash(json.dumps(policy, sort_keys=True, default=str), 16)


def _adopt(client: Any, owner: EdgeOwner) -> EgressEdge | None:
    """The edge of `owner.name` if one is complete with the same policy (after waiting for a maker
    that is still at it); None once any other edge of that name is removed."""
    edge = names(owner.name)
    wanted = policy_hash(owner.policy)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        network = _network(client, edge.network)
        try:
            proxy: dict[str, Any] | None = client.api.inspect_container(edge.proxy)
        except docker.errors.NotFound:
            proxy = None
        if network is None and proxy is None:
            return None
        labels = ((proxy or {}).get("Config") or {}).get("Labels") or (network or {}).get("Labels") or {}
        same = labels.get(POLICY_LABEL) == wanted and labels.get(Labels.SCOPE_KEY) == owner.scope_key
        address = ((((proxy or {}).get("NetworkSettings") or {}).get("Networks") or {}).get(edge.network) or {}).get(
            "IPAddress"
        )
        # a proxy made before it carried the host's addresses is stale: replaced, not adopted
        running = proxy is not None and proxy["State"]["Status"] == "running" and knows_the_host(proxy)
        if same and network is not None and running and address:
            return _edge_from(client, owner, edge, proxy or {}, str(address))
        creator = labels.get(CREATOR_LABEL, "")
        young = subnets.age_s((network or {}).get("Created")) < READY_TIMEOUT_S + 10
        # another maker is at it (this process's makers hold the lock, so an unfinished edge
        # labelled by this process is a leftover)
        if same and young and creator != current_owner() and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        remove_edge(client, owner.name)
        return None


def _network(client: Any, name: str) -> dict[str, Any] | None:
    for network in client.api.networks(filters={"name": name}):
        if network.get("Name") == name:
            return dict(network)
    return None


def _edge_from(client: Any, owner: EdgeOwner, edge: EgressNames, proxy: dict[str, Any], address: str) -> EgressEdge:
    """An adopted edge, as its maker returned it: placeholders re-read from the proxy's policy."""
    env = dict(item.split("=", 1) for item in (proxy.get("Config") or {}).get("Env") or [] if "=" in item)
    try:
        secrets = json.loads(env.get("EGRESS_POLICY", "{}")).get("secrets") or []
    except ValueError:
        secrets = []
    placeholders = {str(s["name"]): str(s["placeholder"]) for s in secrets if "name" in s and "placeholder" in s}
    firewall = hostfirewall.drop_from_bridge(edge.bridge)
    networks = (proxy.get("NetworkSettings") or {}).get("Networks") or {}
    firewall = keep_proxy_off_the_host(client, edge, owner.policy, networks) and firewall
    if not firewall and owner.policy["require_host_firewall"]:
        raise SandboxUnavailable(
            "the host firewall rules for the egress network could not be installed; set "
            "sandbox.egress.require_host_firewall: false to accept that",
            container=owner.name,
        )
    logger.bind(sandbox=owner.name, proxy=edge.proxy).info("egress_proxy_adopted")
    return EgressEdge(edge.network, edge.proxy, f"http://{address}:{PROXY_PORT}", firewall, placeholders)


def _make_edge(client: Any, owner: EdgeOwner) -> EgressEdge:
    policy = owner.policy
    edge = names(owner.name)
    labels = {
        Labels.INSTANCE: owner.instance,
        Labels.TENANT: owner.tenant,
        Labels.AGENT: owner.agent,
        Labels.SCOPE_KEY: owner.scope_key,
        Labels.SESSION: owner.session,
        SANDBOX_LABEL: owner.name,
        CREATOR_LABEL: current_owner(),
        POLICY_LABEL: policy_hash(policy),
    }

    def make_network(ipam: Any) -> Any:
        try:
            return client.networks.create(
                edge.network,
                driver="bridge",
                internal=True,  # no route beyond its own subnet: only the proxy is reachable
                options={"com.docker.network.bridge.name": edge.bridge},
                labels={**labels, Labels.KIND: NETWORK_KIND},
                ipam=ipam,
                check_duplicate=True,  # the name is the claim between makers
            )
        except docker.errors.APIError as exc:
            if "already exists" in str(exc) or "conflicts with network" in str(exc):
                raise _Taken() from exc
            raise

    try:
        network = subnets.create_network(client, str(policy.get("subnet_pool") or subnets.DEFAULT_POOL), make_network)
    except docker.errors.APIError as exc:
        raise SandboxUnavailable(f"the egress network could not be made: {exc}", container=owner.name) from exc
    try:
        firewall = hostfirewall.drop_from_bridge(edge.bridge)
        if not firewall:
            logger.bind(network=edge.network, bridge=edge.bridge).warning("egress_host_firewall_unavailable")
            if policy["require_host_firewall"]:
                raise SandboxUnavailable(
                    "the host firewall rules for the egress network could not be installed (they need root and "
                    "iptables where the engine runs); without them the sandbox reaches every service of the host "
                    "through its bridge. Run the orchestrator there as root, or set "
                    "sandbox.egress.require_host_firewall: false to accept that",
                    container=owner.name,
                )
        network.reload()
        subnet = str(network.attrs["IPAM"]["Config"][0]["Subnet"])
        identity = {
            "tenant": owner.tenant,
            "agent": owner.agent,
            "scope": owner.scope_key,
            "session": owner.session,
        }
        resolved = egress_secrets.resolve(policy, owner.name)
        proxy_policy = {
            **policy,
            "identity": identity,
            "client_subnet": subnet,
            "secrets": resolved,
            "upstream_ca_pem": egress_secrets.upstream_ca_pem(policy, owner.name),
            # refused by the proxy whatever allow_private says (the firewall's second wall)
            "host_addresses": hostaddrs.host_addresses(client, str(policy["upstream_network"])),
        }
        extra_hosts = dict(h.split(":", 1) for h in policy["extra_hosts"]) or None
        container = client.containers.create(
            policy["image"],
            command=proxy_command(policy),
            name=edge.proxy,
            detach=True,
            labels={**labels, Labels.KIND: PROXY_KIND},
            environment={"EGRESS_POLICY": json.dumps(proxy_policy), "HOME": "/tmp"},
            network=policy["upstream_network"],
            extra_hosts=extra_hosts,
            user="1000:1000",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            read_only=True,
            tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"},
            pids_limit=128,
            mem_limit=PROXY_MEMORY,
            memswap_limit=PROXY_MEMORY,
            nano_cpus=PROXY_NANO_CPUS,
            sysctls=PROXY_SYSCTLS,
            log_config=PROXY_LOG_CONFIG,
            init=False,  # the image's entrypoint is tini
            restart_policy={"Name": "no"},
        )
        network.connect(container)
        container.start()
        # its address is known at once; whether mitmproxy listens is awaited after the sandbox
        # is made (see wait_ready): the two start side by side
        attrs = client.api.inspect_container(container.id)
        networks = attrs["NetworkSettings"]["Networks"] or {}
        address = (networks.get(edge.network) or {}).get("IPAddress")
        if not address:
            raise SandboxUnavailable("the egress proxy got no address on the sandbox network", container=owner.name)
        upstream_ok = keep_proxy_off_the_host(client, edge, policy, networks)
        if not upstream_ok:
            logger.bind(proxy=edge.proxy).warning("egress_upstream_firewall_unavailable")
            if policy["require_host_firewall"]:
                raise SandboxUnavailable(
                    "the host firewall rule that keeps the egress proxy off the host's own addresses could not be "
                    "installed (root and iptables where the engine runs); set "
                    "sandbox.egress.require_host_firewall: false to accept that",
                    container=owner.name,
                )
        firewall = firewall and upstream_ok
    except docker.errors.ImageNotFound as exc:
        remove_edge(client, owner.name)
        raise SandboxUnavailable(
            f"the egress proxy image {policy['image']!r} is missing; run `sandbox images build`", container=owner.name
        ) from exc
    except (docker.errors.APIError, SandboxUnavailable) as exc:
        remove_edge(client, owner.name)
        if isinstance(exc, SandboxUnavailable):
            raise
        raise SandboxUnavailable(f"the egress proxy could not be made: {exc}", container=owner.name) from exc
    logger.bind(sandbox=owner.name, proxy=edge.proxy, network=edge.network, subnet=subnet).info("egress_proxy_started")
    placeholders = {str(secret["name"]): str(secret["placeholder"]) for secret in resolved}
    return EgressEdge(edge.network, edge.proxy, f"http://{address}:{PROXY_PORT}", firewall, placeholders)
