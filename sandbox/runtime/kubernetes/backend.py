"""`runtime.backend: kubernetes`: each sandbox a Pod in its tenant's namespace, reached through
the API server only (the official client's `kubernetes.aio` for objects, one `pods/exec`
websocket per agent for commands and files).

The cluster is the inventory, as the engine is on Docker: a Pod's labels say whose it is and
which config made it. The orchestrator may act only in the namespaces an operator prepared
(`sandbox k8s render`): it never creates namespaces, roles or policies itself.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import anyio

from sandbox._log import logger
from sandbox.config.merge import agent_ids, effective_agent
from sandbox.config.models import Config
from sandbox.errors import ConfigError, SandboxUnavailable
from sandbox.runtime.agent.exec_path import AGENT_LABEL, AGENT_PROTOCOL_LABEL, PROTOCOL
from sandbox.runtime.agent.link import AgentLink
from sandbox.runtime.agent.resident import ResidentAgents
from sandbox.runtime.kubernetes import api as k8s_api
from sandbox.runtime.kubernetes import provider
from sandbox.runtime.kubernetes.agent_copy import agent_path
from sandbox.runtime.kubernetes.agents import PodExecStarter, keep_alive
from sandbox.runtime.kubernetes.browser import KubernetesBrowsers
from sandbox.runtime.kubernetes.egress_log import KubernetesEgressLogs
from sandbox.runtime.kubernetes.exec_ws import closed_streams
from sandbox.runtime.kubernetes.names import (
    MANAGED_BY,
    K8sAnnotations,
    K8sLabels,
    label_value,
    namespace_for,
    shared_namespace_problem,
)
from sandbox.runtime.kubernetes.pod import sandbox_pod, workspace_claim
from sandbox.runtime.kubernetes.pods_read import adoptable, facts_of, info_of, why_not_running
from sandbox.runtime.kubernetes.pool import KubernetesWarmPool
from sandbox.runtime.kubernetes.proxy_edge import ProxyEdges
from sandbox.runtime.kubernetes.sandbox import KubernetesSandbox
from sandbox.runtime.naming import short_hash
from sandbox.runtime.protocol import SandboxFacts, SandboxInfo
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.manager import SandboxManager
    from sandbox.runtime.protocol import Browsers, EgressLogs, WarmPool

POLL_S = 0.2
# waiting reasons a Pod does not recover from by waiting: reported at once, not at the timeout
STUCK = frozenset({"ErrImageNeverPull", "InvalidImageName", "ImagePullBackOff", "CreateContainerConfigError"})


REMEMBERED_PODS = 4096  # per-Pod notes kept in memory (a forgotten one costs one more API write)


class KubernetesBackend:
    """Sandboxes as Pods. See the module docstring.

    Args:
        config: the whole config (its `runtime.kubernetes`, and its tenants' namespaces).
        api: an API connection already made (tests); by default one is made from
            `runtime.kubernetes` (kubeconfig and context, or the Pod's service account).
    """

    name = "kubernetes"

    def __init__(self, config: Config, api: k8s_api.Api | None = None) -> None:
        self._config = config
        self.cfg = config.runtime.kubernetes
        if problem := shared_namespace_problem(self.cfg, [t.id for t in config.tenants]):
            raise ConfigError([problem])
        self._api = api
        self._api_lock = anyio.Lock()
        self._http: aiohttp.ClientSession | None = None
        self._namespace_of: dict[str, str] = {}  # pod name -> namespace, as made or listed
        self._pod_of: dict[str, str] = {}  # a session's sandbox name -> the pool Pod it claimed
        self.proxies = ProxyEdges(self.api)
        self._egress_logs = KubernetesEgressLogs(self)
        self._exec_protocols: dict[str, str] = {}  # pod -> the subprotocol noted on it
        self._browsers: KubernetesBrowsers | None = None
        self._heartbeats: dict[int, asyncio.Task[None]] = {}  # id(link) -> its pinger
        self.agents = ResidentAgents(_LazyStarter(self))

    # -- the API -------------------------------------------------------------------------------

    async def api(self) -> k8s_api.Api:
        """The API connection (made on first use)."""
        async with self._api_lock:
            if self._api is None:
                self._api = await k8s_api.connect(self.cfg)
            return self._api

    async def starter(self) -> PodExecStarter:
        """What starts agents over `pods/exec` (sharing the API's address, TLS and credentials)."""
        api = await self.api()
        if self._http is None:
            self._http = aiohttp.ClientSession()
        # a cluster pulls images itself, so their labels cannot be read here: the agent is where
        # the project's images carry it, or where its copy step put it (agent_copy.py)
        images = {
            image: {AGENT_LABEL: agent_path(image, self.cfg), AGENT_PROTOCOL_LABEL: str(PROTOCOL)}
            for image in self._images()
        }
        return PodExecStarter(
            self._http,
            api.url,
            self.namespace_of,
            headers=api.headers,
            image_labels=images,
            heartbeat_s=self.cfg.exec_heartbeat_s,
            ssl=api.ssl,
        )

    async def exec_once(self, pod: str, argv: builtins.list[str], timeout_s: float) -> tuple[int | None, bytes]:
        """`argv` run in the Pod on a `pods/exec` stream of its own, not through its agent."""
        return await (await self.starter()).exec_once(pod, argv, timeout_s)

    def _images(self) -> set[str]:
        return {effective_agent(self._config, a).sandbox.docker.image for a in agent_ids(self._config)}

    def heartbeat(self, link: AgentLink) -> None:
        """Ping `link`'s agent every `exec_heartbeat_s` while it lives (once per link): the kubelet
        cuts a stream that carries nothing, and a websocket ping never reaches the kubelet."""
        if id(link) in self._heartbeats or link.dead is not None:
            return
        task = asyncio.get_running_loop().create_task(keep_alive(link, self.cfg.exec_heartbeat_s))
        self._heartbeats[id(link)] = task
        task.add_done_callback(lambda _: self._heartbeats.pop(id(link), None))

    def namespaces(self) -> list[str]:
        """Every namespace this config's tenants have sandboxes in."""
        tenants = {t.id for t in self._config.tenants}
        tenants |= {effective_agent(self._config, a).tenant for a in agent_ids(self._config)}
        return sorted({namespace_for(self.cfg, t) for t in tenants})

    async def note_exec_protocol(self, pod: str, protocol: str) -> None:
        """Write on the Pod the subprotocol its agent's link agreed (what `explain` shows), when it
        is new to this process: one patch per Pod and protocol. A failure only loses the note."""
        if self._exec_protocols.get(pod) == protocol:
            return
        self._exec_protocols[pod] = protocol
        while len(self._exec_protocols) > REMEMBERED_PODS:  # the oldest first: Pods come and go
            del self._exec_protocols[next(iter(self._exec_protocols))]
        try:
            namespace = self.namespace_of(pod)
            patch = {"metadata": {"annotations": {K8sAnnotations.EXEC_PROTOCOL: protocol}}}
            await (await self.api()).patch("pods", namespace, pod, patch)
        except Exception as exc:
            logger.bind(pod=pod, error=str(exc)).debug("k8s_exec_protocol_not_noted")

    def namespace_of(self, name: str) -> str:
        """The namespace of a Pod this backend made or listed (SandboxUnavailable if unknown)."""
        found = self._namespace_of.get(name)
        if found is None:
            raise SandboxUnavailable(f"no sandbox Pod {name!r} is known to this orchestrator")
        return found

    # -- the Backend protocol ----------------------------------------------------------------

    async def image_id(self, ref: str) -> str:
        """The reference itself: the cluster's nodes resolve and pull images, not this process."""
        return ref

    def placed(self, pod_name: str, namespace: str | None) -> None:
        """Remember the namespace of a Pod made outside :meth:`ensure` (a skill call's), or forget it (None)."""
        if namespace is None:
            self._namespace_of.pop(pod_name, None)
        else:
            self._namespace_of[pod_name] = namespace

    def claimed(self, sandbox_name: str, pod_name: str, namespace: str) -> None:
        """Remember that `sandbox_name`'s session claimed the pool Pod `pod_name` (kubernetes/pool.py)."""
        self._pod_of[sandbox_name] = pod_name
        self._namespace_of[pod_name] = namespace

    async def _claimed_pod(self, namespace: str, sandbox_name: str) -> dict[str, Any] | None:
        """The pool Pod claimed for `sandbox_name`'s session, if any (a Pod cannot be renamed: its
        `claimed` label and annotation name the session's sandbox)."""
        selector = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{K8sLabels.CLAIMED}={label_value(sandbox_name)}"
        for pod in await (await self.api()).list("pods", namespace, selector):
            meta = pod.get("metadata") or {}
            if (meta.get("annotations") or {}).get(K8sAnnotations.SANDBOX_NAME) == sandbox_name:
                self.claimed(sandbox_name, str(meta.get("name")), namespace)
                return pod
        return None

    async def found_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod serving sandbox `name`: its own, or a pool Pod claimed for it."""
        api = await self.api()
        own = await api.get("pods", namespace, self._pod_of.get(name, name))
        return own if own is not None else await self._claimed_pod(namespace, name)

    @staticmethod
    def session_pod_name(spec: SandboxSpec, user: str) -> str:
        """The name of the Pod of `user`'s session in `spec`'s sandbox (see :meth:`session_pod`)."""
        uid = user.partition(":")[0]
        return f"{spec.name[:44]}-u{uid}-{short_hash(f'{spec.name}|{user}', 8)}"

    async def session_pod(self, spec: SandboxSpec, user: str) -> KubernetesSandbox:
        """The Pod of a session with a uid of its own in `spec`'s sandbox: exec cannot choose a
        user under Pod Security restricted, so it is a Pod like `spec`'s running as `user`
        (`uid:gid`, the group the sandbox's), on the same workspace claim, removed with it."""
        name = self.session_pod_name(spec, user)
        # setup_command ran in the sandbox's own Pod, on this same workspace: not again per session
        docker = spec.docker.model_copy(update={"setup_command": None})
        own = dataclasses.replace(spec, name=name, user=user, session_users=False, docker=docker)
        return await self.ensure(own, user_of=spec.name)

    async def ensure(self, spec: SandboxSpec, *, user_of: str | None = None) -> KubernetesSandbox:
        """The Pod of `spec`: adopted when it runs with the same config (a pool Pod claimed for
        it too), else made afresh (`user_of`: see :meth:`session_pod`)."""
        api = await self.api()
        namespace = namespace_for(self.cfg, spec.tenant)
        self._namespace_of[spec.name] = namespace
        found = await self.found_pod(namespace, spec.name) if not spec.pool_member else None
        proxy = await self.proxies.proxy(namespace, spec) if spec.egress is not None else None
        pod = sandbox_pod(spec, self.cfg, namespace, proxy=proxy, user_of=user_of)
        if found is not None and adoptable(found, spec, pod):
            return KubernetesSandbox(self, found["metadata"]["name"], spec)
        if found is not None:
            logger.bind(pod=found["metadata"]["name"], namespace=namespace).info("k8s_pod_replaced")
            await self.delete_and_wait(namespace, found["metadata"]["name"])
            self._pod_of.pop(spec.name, None)
        if spec.egress is not None:
            await self.proxies.write_secret(namespace, spec.tenant, spec.egress)
        if (claim := workspace_claim(spec, self.cfg, namespace)) is not None:
            await api.create("persistentvolumeclaims", namespace, claim, exists_ok=True)
        if self.cfg.provider == "agent-sandbox":  # a SandboxClaim's Pod (kubernetes/provider.py)
            made = await provider.claimed_pod(self, spec, namespace, proxy)
            self.claimed(spec.name, made, namespace)
            return KubernetesSandbox(self, made, spec)
        await api.create("pods", namespace, pod)
        try:
            await self.wait_running(namespace, spec.name)
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await api.delete("pods", namespace, spec.name)
            raise
        return KubernetesSandbox(self, spec.name, spec)

    def pool_size(self, spec: SandboxSpec) -> int:
        """The warm pool size of `spec`'s agent (0: none, or no longer configured)."""
        try:
            return effective_agent(self._config, spec.agent).sandbox.pool.size
        except Exception:  # an agent no longer configured has no pool
            return 0

    async def wait_running(self, namespace: str, name: str) -> None:
        """Until the Pod runs and is ready (SandboxUnavailable at once when it cannot, or at the timeout)."""
        api = await self.api()
        deadline = time.monotonic() + self.cfg.pod_ready_timeout_s
        while True:
            pod = await api.get("pods", namespace, name)
            status = (pod or {}).get("status") or {}
            phase = status.get("phase")
            if pod is None or phase in ("Failed", "Succeeded"):
                raise SandboxUnavailable(f"the sandbox Pod {namespace}/{name} did not start: {why_not_running(pod)}")
            waiting = [
                ((c.get("state") or {}).get("waiting") or {}).get("reason")
                for c in status.get("containerStatuses") or []
            ]
            if STUCK.intersection(waiting):
                raise SandboxUnavailable(f"the sandbox Pod {namespace}/{name} cannot start: {why_not_running(pod)}")
            ready = [c.get("ready") for c in status.get("containerStatuses") or []]
            if phase == "Running" and ready and all(ready):
                return
            if time.monotonic() > deadline:
                raise SandboxUnavailable(
                    f"the sandbox Pod {namespace}/{name} was not running after {self.cfg.pod_ready_timeout_s:.0f} s "
                    f"(runtime.kubernetes.pod_ready_timeout_s): {why_not_running(pod)}"
                )
            await anyio.sleep(POLL_S)

    async def delete_and_wait(self, namespace: str, name: str) -> None:
        """Delete a Pod and wait (up to 60 s) until it is gone, its processes with it."""
        api = await self.api()
        await api.delete("pods", namespace, name)
        for _ in range(int(60 / POLL_S)):  # a Pod deleted at once goes within seconds
            if await api.get("pods", namespace, name) is None:
                return
            await anyio.sleep(POLL_S)
        raise SandboxUnavailable(f"the sandbox Pod {namespace}/{name} was deleted but is still there after 60 s")

    async def exists(self, name: str) -> bool:
        """Whether a Pod of this name is in one of the tenants' namespaces."""
        for namespace in [self._namespace_of.get(name), *self.namespaces()]:
            if (
                namespace
                and self.cfg.provider == "agent-sandbox"
                and await provider.claim_exists(self, namespace, name)
            ):
                self._namespace_of[name] = namespace
                return True
            if namespace and await self.found_pod(namespace, name) is not None:
                self._namespace_of[name] = namespace
                return True
        return False

    async def list(self, *, instance: str | None, tenant: str | None = None) -> builtins.list[SandboxInfo]:
        """This orchestrator's sandbox Pods (or every managed one), in every tenant namespace (with
        `tenant`, that tenant's only, read from its namespace alone)."""
        api = await self.api()
        selector = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{K8sLabels.SANDBOX}=true"
        if instance is not None:
            selector += f",{K8sLabels.INSTANCE}={instance}"
        found: builtins.list[SandboxInfo] = []
        namespaces = self.namespaces() if tenant is None else [namespace_for(self.cfg, tenant)]
        for namespace in namespaces:
            for pod in await api.list("pods", namespace, selector):
                info = info_of(pod)
                self._namespace_of[info.id] = namespace
                if info.name != info.id:  # a claimed pool Pod, listed under its session's sandbox name
                    self.claimed(info.name, info.id, namespace)
                if tenant is None or info.tenant == tenant:  # a shared namespace may hold others' Pods
                    found.append(info)
        return found

    async def remove(self, name_or_id: str) -> None:
        """Delete the Pod (at once: a sandbox has nothing to shut down gracefully): by its name, or
        the pool Pod claimed for a session's sandbox of that name."""
        api = await self.api()
        known = self._namespace_of.get(name_or_id)
        for namespace in [known] if known else self.namespaces():
            if self.cfg.provider == "agent-sandbox":
                await provider.release(self, namespace, name_or_id)
            pod = self._pod_of.pop(name_or_id, None)
            if pod is None and (claimed := await self._claimed_pod(namespace, name_or_id)) is not None:
                pod = self._pod_of.pop(name_or_id, claimed["metadata"]["name"])
            # its sessions' own Pods go with it
            selector = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{K8sLabels.USER_OF}={label_value(name_or_id)}"
            sessions = [p["metadata"]["name"] for p in await api.list("pods", namespace, selector)]
            for name in {name_or_id, pod or name_or_id, *sessions}:
                self.agents.forget(name)
                await api.delete("pods", namespace, name)
                self._namespace_of.pop(name, None)  # one per Pod ever made would stay otherwise

    async def aclose(self) -> None:
        """Close the agents' streams, the browsers' forwards and the API connection."""
        if self._browsers is not None:
            await self._browsers.aclose()
        for task in list(self._heartbeats.values()):
            task.cancel()
        self.agents.close_all()
        await closed_streams()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def facts(self, name_or_id: str) -> SandboxFacts | None:
        """What the API says the sandbox Pod is (None: no such Pod). No PID limit: Kubernetes has
        none per Pod yet (a node's podPidsLimit applies)."""
        namespace = self._namespace_of.get(name_or_id)
        pod = await self.found_pod(namespace, name_or_id) if namespace else None
        return facts_of(name_or_id, pod) if pod is not None else None

    def warm_pool(self, manager: SandboxManager) -> WarmPool | None:
        """Pods per pool key, claimed by a label patch (kubernetes/pool.py); none with the
        agent-sandbox provider, whose SandboxWarmPool keeps its own."""
        return KubernetesWarmPool(manager, self) if self.cfg.provider == "pods" else None

    def egress(self) -> EgressLogs | None:
        """The proxies' request lines, attributed by the sandbox Pods' addresses (kubernetes/egress_log.py)."""
        return self._egress_logs

    def freezer(self) -> None:
        """No pausing on a cluster: a Pod cannot be frozen through the API (its sandboxes keep running)."""

    def browsers(self, instance: str) -> Browsers | None:
        """Browser Pods, their DevTools through the API server's port forwarding (kubernetes/browser.py)."""
        if self._browsers is None or self._browsers.instance != instance:
            self._browsers = KubernetesBrowsers(self, instance)
        return self._browsers


class _LazyStarter:
    """The agents' starter, made with the API connection on first use."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self._backend = backend

    async def image_labels(self, image: str) -> dict[str, str] | None:
        return await (await self._backend.starter()).image_labels(image)

    async def start(self, container_id: str, argv: builtins.list[str], user: str | None) -> Any:
        transport = await (await self._backend.starter()).start(container_id, argv, user)
        await self._backend.note_exec_protocol(container_id, transport.protocol)
        return transport

    async def kill(self, container_id: str, transport: Any) -> None:
        await (await self._backend.starter()).kill(container_id, transport)
