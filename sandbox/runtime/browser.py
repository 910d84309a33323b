"""The browser sandbox: its own image, its own Docker network, CDP published on loopback only."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import docker.errors
from loguru import logger

from sandbox.config.merge import EffectiveAgent
from sandbox.errors import ErrorCode, SandboxError, SandboxUnavailable
from sandbox.runtime.docker_backend import DockerBackend
from sandbox.runtime.naming import SCHEMA_VERSION, Labels, container_name, scope_key


@dataclass(frozen=True)
class BrowserEndpoint:
    """A running browser sandbox and where its DevTools protocol answers (host side)."""

    container_id: str
    name: str
    network: str
    cdp_url: str  # http://127.0.0.1:<random port>
    browser_version: str


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

    async def ensure_network(self, name: str) -> None:
        """Create the browser network if it does not exist."""

        def make() -> None:
            client = self.backend.client
            if not client.networks.list(names=[name]):
                client.networks.create(name, driver="bridge", labels={Labels.MANAGED: "true"})

        await self.backend.call("create browser network", make)

    async def ensure(self, agent: EffectiveAgent, session: str, *, browser_allowed: bool) -> BrowserEndpoint:
        """The browser sandbox of a session, started (and health-checked) if needed.

        Raises:
            SandboxError: PERMISSION_DENIED when the policy or the config does not enable it;
                SANDBOX_UNAVAILABLE when it does not come up (the container is then removed).
        """
        cfg = agent.sandbox.browser
        if not browser_allowed:
            raise SandboxError(ErrorCode.PERMISSION_DENIED, "the browser tool is not allowed for this session")
        if not cfg.enabled:
            raise SandboxError(
                ErrorCode.PERMISSION_DENIED,
                f"the browser sandbox is disabled; set {agent.key_path}.sandbox.browser.enabled: true",
            )
        key = scope_key(agent.sandbox.scope, agent.id, session)
        name = container_name(self.instance, "browser", key)
        async with self._lock:
            attrs = await self.backend.find(name)
            if attrs is not None and attrs["State"]["Status"] == "running":
                endpoint = self._endpoint(attrs, cfg.cdp_port, cfg.network)
                if endpoint is not None:
                    version = await anyio.to_thread.run_sync(_cdp_version, endpoint.cdp_url)
                    if version is not None:
                        return endpoint
            if attrs is not None:
                await self.backend.remove(attrs["Id"])
            await self.ensure_network(cfg.network)
            return await self._start(agent, key, name)

    @staticmethod
    def _endpoint(attrs: dict[str, Any], port: int, network: str, version: str = "") -> BrowserEndpoint | None:
        bindings = (attrs.get("NetworkSettings", {}).get("Ports") or {}).get(f"{port}/tcp") or []
        for binding in bindings:
            if binding.get("HostIp") == "127.0.0.1" and binding.get("HostPort"):
                url = f"http://127.0.0.1:{binding['HostPort']}"
                return BrowserEndpoint(attrs["Id"], attrs["Name"].lstrip("/"), network, url, version)
        return None

    async def _start(self, agent: EffectiveAgent, key: str, name: str) -> BrowserEndpoint:
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
        }

        def create() -> str:
            container = self.backend.client.containers.run(
                cfg.image,
                name=name,
                detach=True,
                labels=labels,
                network=cfg.network,
                ports={f"{cfg.cdp_port}/tcp": ("127.0.0.1", None)},  # loopback only, random host port
                environment={"CDP_PORT": str(cfg.cdp_port)},
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
            endpoint = self._endpoint(attrs, cfg.cdp_port, cfg.network)
            version = await anyio.to_thread.run_sync(_cdp_version, endpoint.cdp_url) if endpoint else None
            if endpoint and version:
                logger.bind(container=name, cdp=endpoint.cdp_url).info("browser_started")
                return BrowserEndpoint(
                    endpoint.container_id,
                    endpoint.name,
                    cfg.network,
                    endpoint.cdp_url,
                    str(version.get("Browser", "")),
                )
            await anyio.sleep(0.25)
        await self.backend.remove(container_id)
        raise SandboxUnavailable(
            f"the browser sandbox did not answer on CDP within {cfg.startup_timeout_s:g}s; it was removed",
            container=name,
        )
