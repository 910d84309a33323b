"""Browser sandboxes on a cluster (`Backend.browsers`): one Pod per scope key, its DevTools port
carried to this host's loopback through the API server (portforward.py), never opened on the
cluster's network. The browser tool connects to that loopback address as it connects to a
Docker browser's; it does not know which engine runs it.

A forward lives in this process: a Pod found running with the shape this orchestrator renders
(after a restart, or made by another replica) gets a forward of its own; any other Pod under the
name is replaced. A session-scoped browser goes with its session; agent- and shared-scope ones
stay (as on Docker) until removed.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from sandbox.config.merge import EffectiveAgent
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.browser_rules import browser_egress_policy, require_browser
from sandbox.runtime.kubernetes.browser_pod import browser_pod
from sandbox.runtime.kubernetes.names import K8sLabels, namespace_for
from sandbox.runtime.kubernetes.pod import ProxyRef
from sandbox.runtime.kubernetes.pods_read import same_shape
from sandbox.runtime.kubernetes.portforward import LocalForward
from sandbox.runtime.naming import container_name, scope_key
from sandbox.runtime.protocol import BrowserEndpoint

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sandbox.runtime.kubernetes.backend import KubernetesBackend


def _cdp_version(port: int) -> dict[str, Any] | None:
    """The browser's /json/version through the forward (None: it does not answer yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=2) as response:
            found = json.loads(response.read())
            return dict(found) if isinstance(found, dict) else None
    except (OSError, ValueError):
        return None


def _same_browser(found: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether a live browser Pod is the one rendered: restricted and of its shape, with its
    environment, its pinned proxy and its egress label (what lets it reach that proxy)."""
    live, want = found.get("spec") or {}, pod["spec"]
    live_labels = (found.get("metadata") or {}).get("labels") or {}
    return (
        same_shape(found, pod)
        and (live.get("containers") or [{}])[0].get("env") == want["containers"][0]["env"]
        and live.get("hostAliases") == want.get("hostAliases")
        and live_labels.get(K8sLabels.EGRESS) == pod["metadata"]["labels"].get(K8sLabels.EGRESS)
    )


class KubernetesBrowsers:
    """Browser Pods, one per scope key (the Browsers capability, runtime/protocol.py)."""

    def __init__(self, backend: KubernetesBackend, instance: str) -> None:
        self.backend = backend
        self.instance = instance
        self._forwards: dict[str, LocalForward] = {}  # browser Pod -> its forward
        self._lock = anyio.Lock()

    def name_for(self, agent: EffectiveAgent, session: str) -> str:
        """The browser Pod's name for this agent and session (as Docker names the container)."""
        return container_name(
            self.instance, "browser", scope_key(agent.sandbox.scope, agent.id, session), tenant=agent.tenant
        )

    async def ensure(self, agent: EffectiveAgent, session: str, *, browser_allowed: bool) -> BrowserEndpoint:
        """The browser of a session, made (or found) and answering over its forward.

        Raises:
            SandboxError: PERMISSION_DENIED when the policy or the config does not enable it;
                SANDBOX_UNAVAILABLE when it does not come up (its Pod is then deleted).
        """
        require_browser(agent, browser_allowed)
        key = scope_key(agent.sandbox.scope, agent.id, session)
        name = self.name_for(agent, session)
        namespace = namespace_for(self.backend.cfg, agent.tenant)
        policy = browser_egress_policy(agent)
        proxy = ProxyRef(await self.backend.proxies.address(namespace, agent.tenant, policy)) if policy else None
        pod = browser_pod(
            agent, name, key, session, self.instance, self.backend.cfg, namespace, proxy=proxy, policy=policy
        )
        api = await self.backend.api()
        async with self._lock:
            self.backend._namespace_of[name] = namespace
            found = await api.get("pods", namespace, name)
            running = found is not None and (found.get("status") or {}).get("phase") == "Running"
            if found is not None and running and _same_browser(found, pod):
                endpoint = await self._answering(name, agent, timeout_s=5.0)
                if endpoint is not None:
                    return endpoint
            if found is not None:
                await self._remove(namespace, name)
            if policy is not None:  # its proxy starts from this Secret (the allowlist, no values)
                await self.backend.proxies.write_secret(namespace, agent.tenant, policy)
            await api.create("pods", namespace, pod)
            try:
                await self.backend.wait_running(namespace, name)
                endpoint = await self._answering(name, agent, timeout_s=agent.sandbox.browser.startup_timeout_s)
                if endpoint is None:
                    raise SandboxUnavailable(
                        f"the browser Pod {namespace}/{name} runs but its DevTools port did not answer within "
                        f"{agent.sandbox.browser.startup_timeout_s:g}s"
                    )
            except BaseException:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await self._remove(namespace, name)
                raise
            return endpoint

    async def close_session(
        self, agent: EffectiveAgent, session: str, before: Callable[[str], Awaitable[object]] | None = None
    ) -> bool:
        """A session-scoped browser goes with its session; `before(name)` runs first."""
        if agent.sandbox.scope != "session":
            return False
        name = self.name_for(agent, session)
        namespace = namespace_for(self.backend.cfg, agent.tenant)
        if await (await self.backend.api()).get("pods", namespace, name) is None:
            return False
        if before is not None:
            await before(name)
        async with self._lock:
            await self._remove(namespace, name)
        return True

    async def aclose(self) -> None:
        """Stop every forward (the Pods stay: they are the cluster's until removed)."""
        for forward in list(self._forwards.values()):
            await forward.aclose()
        self._forwards.clear()

    async def _answering(self, name: str, agent: EffectiveAgent, *, timeout_s: float) -> BrowserEndpoint | None:
        """The browser's endpoint once its DevTools answer through a forward (None: not in time)."""
        forward = self._forwards.get(name)
        if forward is None or not forward.serving:
            starter = await self.backend.starter()
            port = agent.sandbox.browser.cdp_port

            async def connect() -> Any:
                return await starter.forward(name, port)

            forward = LocalForward(connect, name)
            await forward.start()
            self._forwards[name] = forward
        deadline = time.monotonic() + timeout_s
        while True:
            version = await anyio.to_thread.run_sync(_cdp_version, forward.port)
            if version is not None:
                return BrowserEndpoint(
                    container_id=name,
                    name=name,
                    network="its Pod's own (deny-all); DevTools through the API server's port forwarding",
                    cdp_url=f"http://127.0.0.1:{forward.port}",
                    browser_version=str(version.get("Browser", "")),
                )
            if time.monotonic() > deadline:
                return None
            await anyio.sleep(0.25)

    async def _remove(self, namespace: str, name: str) -> None:
        forward = self._forwards.pop(name, None)
        if forward is not None:
            await forward.aclose()
        await self.backend.delete_and_wait(namespace, name)
