"""The browser sandbox: its own image, a Docker network of its own, CDP reachable by the host only.

Every browser sandbox gets its own internal bridge network (no route beyond its subnet, no other
member), so code in one page can never reach another session's or tenant's browser, and the
orchestrator reaches CDP at the container's address on that bridge (nothing is published). An
internal network still routes to the host itself through the bridge's gateway address, so the
host's firewall drops every connection the browser opens towards the host on that bridge
(see `sandbox.runtime.docker.hostfirewall`).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import docker.errors

from sandbox._log import logger
from sandbox.config.merge import EffectiveAgent
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.journal.owners import current_owner
from sandbox.runtime.browser_rules import browser_egress_policy, require_browser
from sandbox.runtime.docker import egress, egress_make, hostfirewall, subnets
from sandbox.runtime.egress_proxy import PROXY_PORT
from sandbox.runtime.naming import (
    CREATOR_LABEL,
    LABEL_PREFIX,
    SCHEMA_VERSION,
    Labels,
    container_name,
    scope_key,
    short_hash,
)
from sandbox.runtime.protocol import BrowserEndpoint

if TYPE_CHECKING:
    from sandbox.runtime.docker.backend import DockerBackend  # backend.py imports this module

NETWORK_KIND = "browser-net"
EGRESS_LABEL = f"{LABEL_PREFIX}.egress-policy"  # hash of the egress policy a browser was made with


def network_names(prefix: str, container: str) -> tuple[str, str]:
    """(Docker network name, bridge interface name <= 15 chars) of one browser sandbox."""
    digest = short_hash(container, 12)
    return f"{prefix}-{digest}", f"sbx{digest}"


def _cdp_version(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{url}/json/version", timeout=2) as response:  # noqa: S310 - loopback URL we built
            return dict(json.loads(response.read()))
    except (OSError, ValueError):
        return None


class BrowserManager:
    """Starts one browser sandbox per scope key, on its own network.

    Args:
        backend: the Docker backend.
        instance: this orchestrator's instance id.
    """

    def __init__(self, backend: DockerBackend, instance: str) -> None:
        self.backend = backend
        self.instance = instance
        self._lock = anyio.Lock()

    async def ensure_network(
        self, name: str, bridge: str, labels: dict[str, str], pool: str = subnets.DEFAULT_POOL
    ) -> bool:
        """Create the browser's own internal network (if missing: a /29 of `pool`) and drop its
        traffic to the host.

        Returns whether the host firewall rule is in place.
        """

        def make() -> None:
            client = self.backend.client
            if any(n.name == name for n in client.networks.list(names=[name])):
                return
            try:
                subnets.create_network(
                    client,
                    pool,
                    lambda ipam: client.networks.create(
                        name,
                        driver="bridge",
                        internal=True,  # no route beyond its own subnet: no metadata, no LAN, no internet
                        options={
                            "com.docker.network.bridge.name": bridge,
                            "com.docker.network.bridge.enable_icc": "false",
                        },
                        labels={**labels, CREATOR_LABEL: current_owner()},
                        ipam=ipam,
                        check_duplicate=True,
                    ),
                )
            except docker.errors.APIError as exc:
                if "already exists" not in str(exc):  # another maker's: the same network
                    raise

        await self.backend.call("create browser network", make)
        return await anyio.to_thread.run_sync(hostfirewall.drop_from_bridge, bridge)

    async def remove_unused_networks(self) -> list[str]:
        """Remove this instance's browser networks that no container uses, with their firewall rules."""

        def sweep() -> list[str]:
            removed = []
            client = self.backend.client
            filters = {"label": [f"{Labels.KIND}={NETWORK_KIND}", f"{Labels.INSTANCE}={self.instance}"]}
            for network in client.networks.list(filters=filters):
                network.reload()
                if network.attrs.get("Containers"):
                    continue
                bridge = (network.attrs.get("Options") or {}).get("com.docker.network.bridge.name", "")
                try:
                    network.remove()
                except docker.errors.APIError:
                    continue
                if bridge:
                    hostfirewall.remove_rules(bridge)
                removed.append(network.name)
            return removed

        return await self.backend.call("remove browser networks", sweep)

    def name_for(self, agent: EffectiveAgent, session: str) -> str:
        """The container name of the browser sandbox a session of `agent` uses."""
        return container_name(
            self.instance, "browser", scope_key(agent.sandbox.scope, agent.id, session), tenant=agent.tenant
        )

    async def close_session(
        self, agent: EffectiveAgent, session: str, before: Callable[[str], Awaitable[object]] | None = None
    ) -> bool:
        """A session-scoped browser goes with its session (with its network or egress edge);
        `before(name)` runs first (its proxy's last lines into the journal)."""
        if agent.sandbox.scope != "session":
            return False
        name = self.name_for(agent, session)
        if await self.backend.find(name) is None:
            return False
        if before is not None:
            await before(name)
        await self.backend.remove(name)
        await self.remove_unused_networks()
        return True

    async def ensure(self, agent: EffectiveAgent, session: str, *, browser_allowed: bool) -> BrowserEndpoint:
        """The browser sandbox of a session, started (and health-checked) if needed.

        Raises:
            SandboxError: PERMISSION_DENIED when the policy or the config does not enable it;
                SANDBOX_UNAVAILABLE when it does not come up (the container is then removed).
        """
        cfg = agent.sandbox.browser
        require_browser(agent, browser_allowed)
        key = scope_key(agent.sandbox.scope, agent.id, session)
        name = container_name(self.instance, "browser", key, tenant=agent.tenant)
        policy = browser_egress_policy(agent)
        wanted = short_hash(json.dumps(policy, sort_keys=True), 16) if policy is not None else ""
        async with self._lock:
            attrs = await self.backend.find(name)
            network, bridge = network_names(cfg.network, name)
            if policy is not None:
                network, bridge = egress.names(name).network, egress.names(name).bridge
            current = attrs is not None and ((attrs["Config"].get("Labels") or {}).get(EGRESS_LABEL, "")) == wanted
            if current and policy is not None:
                current = await self.backend.call(
                    "inspect egress proxy", egress.proxy_running, self.backend.client, name
                )
            if attrs is not None and current and attrs["State"]["Status"] == "running":
                endpoint = self._endpoint(attrs, cfg.cdp_port, network)
                if endpoint is not None:
                    version = await anyio.to_thread.run_sync(_cdp_version, endpoint.cdp_url)
                    firewall = await anyio.to_thread.run_sync(hostfirewall.drop_from_bridge, bridge)
                    if version is not None:
                        return BrowserEndpoint(
                            endpoint.container_id, endpoint.name, network, endpoint.cdp_url, "", firewall
                        )
            if attrs is not None:
                await self.backend.remove(attrs["Id"])
            await self.remove_unused_networks()
            if policy is not None:
                return await self._start_with_egress(agent, key, name, session, policy, wanted)
            labels = {
                Labels.MANAGED: "true",
                Labels.INSTANCE: self.instance,
                Labels.KIND: NETWORK_KIND,
                Labels.TENANT: agent.tenant,
                Labels.SCOPE_KEY: key,
            }
            firewall = await self.ensure_network(network, bridge, labels, agent.sandbox.egress.subnet_pool)
            if not firewall:
                logger.bind(network=network, bridge=bridge).warning("browser_host_firewall_unavailable")
            endpoint = await self._start(agent, key, name, network)
            return BrowserEndpoint(
                endpoint.container_id, endpoint.name, network, endpoint.cdp_url, endpoint.browser_version, firewall
            )

    async def _start_with_egress(
        self, agent: EffectiveAgent, key: str, name: str, session: str, policy: dict[str, Any], wanted: str
    ) -> BrowserEndpoint:
        """`network: egress`: the browser on an internal network with a proxy of its own (as the exec
        sandbox, with the same allowlist), every request sent to that proxy."""
        owner = egress.EdgeOwner(
            name,
            self.instance,
            agent.tenant,
            agent.id,
            key,
            session if agent.sandbox.scope == "session" else "",
            policy,
        )
        client = self.backend.client
        egress.MAKING.add(name)  # an orphan sweep meanwhile leaves its proxy alone
        try:
            edge = await self.backend.call("create browser egress proxy", egress_make.create_edge, client, owner)
            endpoint = await self._start(agent, key, name, edge.network, proxy=edge.proxy_address, egress_hash=wanted)
            await self.backend.call("start browser egress proxy", egress.wait_ready, client, name)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.backend.remove(name)
                await self.backend.call("remove browser egress proxy", egress.remove_edge, client, name)
            raise
        finally:
            egress.MAKING.discard(name)
        return BrowserEndpoint(
            endpoint.container_id,
            endpoint.name,
            edge.network,
            endpoint.cdp_url,
            endpoint.browser_version,
            edge.host_firewall,
        )

    @staticmethod
    def _endpoint(attrs: dict[str, Any], port: int, network: str, version: str = "") -> BrowserEndpoint | None:
        # CDP at the container's address on its own network: nothing is published on the host
        address = ((attrs.get("NetworkSettings", {}).get("Networks") or {}).get(network) or {}).get("IPAddress")
        if not address:
            return None
        return BrowserEndpoint(attrs["Id"], attrs["Name"].lstrip("/"), network, f"http://{address}:{port}", version)

    async def _start(
        self, agent: EffectiveAgent, key: str, name: str, network: str, *, proxy: str = "", egress_hash: str = ""
    ) -> BrowserEndpoint:
        cfg = agent.sandbox.browser
        docker_cfg = agent.sandbox.docker
        now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        labels = {
            Labels.MANAGED: "true",
            Labels.INSTANCE: self.instance,
            Labels.KIND: "browser",
            Labels.TENANT: agent.tenant,
            Labels.AGENT: agent.id,
            Labels.SCOPE: agent.sandbox.scope,
            Labels.SCOPE_KEY: key,
            Labels.SESSION: "",
            Labels.CONFIG_HASH: "",
            Labels.CREATED_AT: now,
            Labels.LAST_USED: now,
            Labels.SCHEMA: SCHEMA_VERSION,
            EGRESS_LABEL: egress_hash,
        }
        environment = {"CDP_PORT": str(cfg.cdp_port)}
        extra: dict[str, Any] = {}
        if proxy:
            environment["PROXY_SERVER"] = f"{proxy}:{PROXY_PORT}"
            extra["dns"] = [proxy]  # what the engine's resolver cannot answer goes nowhere (as for exec)

        def create() -> str:
            container = self.backend.client.containers.run(
                cfg.image,
                name=name,
                detach=True,
                labels=labels,
                network=network,
                environment=environment,
                user="1000:1000",
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                read_only=True,
                tmpfs={
                    "/tmp": "rw,nosuid,nodev,size=512m",
                    "/home/browser": "rw,nosuid,nodev,size=256m",
                },
                pids_limit=max(docker_cfg.pids_limit, 512),
                mem_limit=docker_cfg.memory,
                memswap_limit=docker_cfg.memory,
                nano_cpus=int(docker_cfg.cpus * 1e9),
                init=True,
                restart_policy={"Name": "no"},
                **extra,
            )
            return str(container.id)

        try:
            container_id = await self.backend.call("start browser", create)
        except SandboxError:
            raise
        except docker.errors.NotFound as exc:
            raise SandboxUnavailable(f"browser network or image missing: {exc}") from exc
        deadline = time.monotonic() + cfg.startup_timeout_s
        while time.monotonic() < deadline:
            attrs = await self.backend.find(container_id)
            if attrs is None or attrs["State"]["Status"] != "running":
                break
            endpoint = self._endpoint(attrs, cfg.cdp_port, network)
            version = await anyio.to_thread.run_sync(_cdp_version, endpoint.cdp_url) if endpoint else None
            if endpoint and version:
                logger.bind(container=name, cdp=endpoint.cdp_url).info("browser_started")
                return BrowserEndpoint(
                    endpoint.container_id, endpoint.name, network, endpoint.cdp_url, str(version.get("Browser", ""))
                )
            await anyio.sleep(0.25)
        await self.backend.remove(container_id)
        raise SandboxUnavailable(
            f"the browser sandbox did not answer on CDP within {cfg.startup_timeout_s:g}s; it was removed",
            container=name,
        )
