"""`network: egress`: a sandbox whose only way out is a proxy of its own, enforcing its allowlist.

Each egress sandbox gets an internal Docker network (no route beyond its subnet) whose only other
member is an egress proxy container (images/egress: mitmproxy with the allowlist addon). The proxy
is also on the upstream network, so it alone can reach out, after checking the host name, the
port and every address the name resolves to (never one of the host's own, `hostaddrs`, whatever
`allow_private` says; the host firewall drops those too, `keep_proxy_off_the_host`). The sandbox
has no DNS of its own that leaves the network (names resolve at the proxy) and the host's
firewall drops what it sends to the host through its bridge, as for the browser. Proxy and
network live and die with their sandbox: one per sandbox, so two sessions or tenants never share
a network or a proxy.

Proxies are not `managed` containers (they are not sandboxes): `sandbox list` does not show
them; they carry the name of their sandbox in a label and are removed with it, or swept when
their sandbox is gone.

This module holds the edge's names, owner and checks; making one is egress_make.py's, sweeping
the orphans netsweep.py's (both import this module, never the other way).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import docker.errors

from sandbox._log import logger
from sandbox.errors import SandboxUnavailable
from sandbox.runtime import egress_secrets
from sandbox.runtime.docker import hostfirewall
from sandbox.runtime.naming import LABEL_PREFIX, short_hash
from sandbox.runtime.spec import SandboxSpec

PROXY_KIND = "egress-proxy"
NETWORK_KIND = "egress-net"
SANDBOX_LABEL = f"{LABEL_PREFIX}.egress-of"  # on the proxy and the network: their sandbox's name
READY_TIMEOUT_S = 30.0
# a proxy whose sandbox is missing is left alone this long while its creator (another live
# process) may still be making the sandbox; this process knows its own (MAKING)
ORPHAN_GRACE_S = 120.0
MAKING: set[str] = set()  # sandboxes whose edge this process is making right now
NETWORK_REMOVE_WAIT_S = 5.0
# the proxy's own log, bounded on the host whatever the daemon's default (lines past it are
# lost, and the collector records the gap)
PROXY_LOG_CONFIG = {"type": "json-file", "config": {"max-size": "10m", "max-file": "2"}}


@dataclass(frozen=True)
class EgressNames:
    """Docker names of one sandbox's egress edge."""

    proxy: str
    network: str
    bridge: str  # the bridge interface, <= 15 characters


def names(sandbox_name: str) -> EgressNames:
    """The proxy, network and bridge names of a sandbox (derived from its name: found again after a restart)."""
    digest = short_hash(f"egress|{sandbox_name}", 24)
    return EgressNames(f"sbx-egress-{digest}", f"sbx-egress-{digest}", f"sbe{digest[:12]}")


@dataclass(frozen=True)
class EgressEdge:
    """What a sandbox is created with: its network and its proxy's address there."""

    network: str
    proxy: str
    proxy_url: str
    host_firewall: bool
    placeholders: dict[str, str] = field(default_factory=dict)  # secret name -> what the sandbox sees

    @property
    def proxy_address(self) -> str:
        """The proxy's address on the sandbox network."""
        return self.proxy_url.split("//", 1)[1].rsplit(":", 1)[0]

    def environment(self) -> dict[str, str]:
        """The proxy variables every common tool reads (curl, pip, git, requests, npm)."""
        url = self.proxy_url
        return {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": "",
            "no_proxy": "",
            **egress_secrets.sandbox_environment(self.placeholders),
        }


@dataclass(frozen=True)
class EdgeOwner:
    """The container an edge serves (an exec sandbox or a browser) and the policy it enforces."""

    name: str
    instance: str
    tenant: str
    agent: str
    scope_key: str
    session: str  # "" unless the container belongs to one session
    policy: dict[str, Any]

    @classmethod
    def of(cls, spec: SandboxSpec) -> EdgeOwner:
        """The owner of an exec sandbox's edge."""
        assert spec.egress is not None
        session = spec.session if spec.scope == "session" else ""
        return cls(spec.name, spec.instance, spec.tenant, spec.agent, spec.scope_key, session, spec.egress)


def wait_ready(client: Any, sandbox_name: str) -> str:
    """Return once the sandbox's proxy says it runs, with its CA certificate ("" unless it
    intercepts for secrets); blocking.

    Raises:
        SandboxUnavailable: it exited, or did not say so within READY_TIMEOUT_S (its last lines are in the message).
    """
    proxy = names(sandbox_name).proxy
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        attrs = client.api.inspect_container(proxy)
        if attrs["State"]["Status"] not in ("created", "running"):
            break
        for line in client.api.logs(proxy, stdout=True, stderr=False, tail=20).splitlines():
            if line.startswith(b'{"egress": 0') and len(line) < 64 * 1024:
                try:
                    ready = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ready, dict) and ready.get("ready") is True:
                    return str(ready.get("ca") or "")
        time.sleep(0.05)
    tail = client.api.logs(proxy, stdout=True, stderr=True, tail=10).decode(errors="replace")
    raise SandboxUnavailable(
        f"the egress proxy did not start within {READY_TIMEOUT_S:g}s: {tail.strip()[-500:]}", container=sandbox_name
    )


def remove_edge(client: Any, sandbox_name: str) -> bool:
    """Remove a sandbox's proxy and network (with its firewall rules); missing is fine. Blocking.

    The network may still have the sandbox as an endpoint for a moment (its removal in progress
    elsewhere): retried for a few seconds. Each set of firewall rules goes only with what it
    guards: the bridge's once the network is gone (a network a container is still on keeps them,
    or that container would reach the host), the proxy's once the proxy is gone.
    """
    edge = names(sandbox_name)
    removed = proxy_gone = network_gone = False
    try:
        try:
            client.api.remove_container(edge.proxy, force=True)
            removed = proxy_gone = True
        except docker.errors.NotFound:
            proxy_gone = True
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise
            proxy_gone = True  # the engine is removing it
        deadline = time.monotonic() + NETWORK_REMOVE_WAIT_S
        while True:
            try:
                client.api.remove_network(edge.network)
                removed = network_gone = True
                break
            except docker.errors.NotFound:
                network_gone = True
                break
            except docker.errors.APIError as exc:
                if "active endpoints" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        if network_gone:
            hostfirewall.remove_rules(edge.bridge)
        if proxy_gone:
            hostfirewall.remove_tagged(edge.proxy)
    return removed


def keep_proxy_off_the_host(client: Any, edge: EgressNames, policy: dict[str, Any], networks: dict[str, Any]) -> bool:
    """Drop what the proxy opens towards the host on its upstream bridge: the host's addresses,
    its public ones too (which the address check cannot know), stay out of reach."""
    upstream = str(policy["upstream_network"])
    proxy_ip = (networks.get(upstream) or {}).get("IPAddress")
    try:
        attrs = client.api.inspect_network(upstream)
    except docker.errors.NotFound:
        return False
    options = attrs.get("Options") or {}
    interface = options.get("com.docker.network.bridge.name") or f"br-{str(attrs['Id'])[:12]}"
    if not proxy_ip:
        return False
    return hostfirewall.drop_from_source(str(interface), str(proxy_ip), edge.proxy)


def proxy_running(client: Any, sandbox_name: str) -> bool:
    """Whether the sandbox's proxy runs and refuses the host's addresses (a sandbox whose proxy
    died, or was made before proxies carried the host's addresses, is remade with a new one)."""
    try:
        attrs = client.api.inspect_container(names(sandbox_name).proxy)
    except docker.errors.NotFound:
        return False
    return bool(attrs["State"]["Status"] == "running") and knows_the_host(attrs)


def knows_the_host(attrs: dict[str, Any]) -> bool:
    """Whether a proxy (its `docker inspect`) was given the host's addresses to refuse."""
    for item in (attrs.get("Config") or {}).get("Env") or []:
        if str(item).startswith("EGRESS_POLICY="):
            try:
                policy = json.loads(str(item).split("=", 1)[1])
            except ValueError:
                return False
            return isinstance(policy, dict) and isinstance(policy.get("host_addresses"), list)
    return False


def bridge_guarded(sandbox_name: str) -> bool:
    """Make sure the rules that keep the sandbox off the host through its bridge are in place,
    restoring them if something removed them (checked when a sandbox is made and when it is
    adopted: a sandbox on a bridge without them reaches every service of the host). Blocking.
    True when they are in."""
    bridge = names(sandbox_name).bridge
    if hostfirewall.rules_present(bridge):
        return True
    restored = hostfirewall.drop_from_bridge(bridge)
    logger.bind(sandbox=sandbox_name, bridge=bridge, restored=restored).warning("egress_bridge_rules_missing")
    return restored
