"""The Docker backend: sandboxes as containers, through the docker SDK, off the event loop."""

from __future__ import annotations

import builtins
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
import docker
import docker.errors
from docker.types import Mount as DockerMount
from docker.types import Ulimit

from sandbox._log import logger
from sandbox.config.binds import CONTAINER_WORKDIR
from sandbox.errors import ErrorCode, SandboxError, SandboxUnavailable
from sandbox.journal.owners import current_owner
from sandbox.runtime import egress_secrets, link_folders, protocol
from sandbox.runtime.agent.fifo_link import INSIDE
from sandbox.runtime.agent.resident import ResidentAgents
from sandbox.runtime.bounded import remember
from sandbox.runtime.docker import egress, egress_make, netsweep, procfs
from sandbox.runtime.docker.agent_links import AgentLinkFolders, folder_in
from sandbox.runtime.docker.agent_stream import DockerAgents
from sandbox.runtime.docker.browser import BrowserManager
from sandbox.runtime.docker.client import CONTROL_TIMEOUT_S, connect
from sandbox.runtime.docker.create import create_container, create_kwargs
from sandbox.runtime.docker.egress_log import DockerEgressLogs
from sandbox.runtime.docker.errors import mapped
from sandbox.runtime.docker.freeze import DockerFreezer
from sandbox.runtime.docker.inspected import facts_from_container, info_from_container
from sandbox.runtime.docker.pool import PoolClaims, WarmPool
from sandbox.runtime.docker.reuse import CONFIG_KEYS_LABEL, bridge_guarded, key_hashes, reusable
from sandbox.runtime.docker.sandbox import DockerSandbox
from sandbox.runtime.docker.workspace import WORKSPACE_ID_LABEL, recorded_id, workspace_id
from sandbox.runtime.folders import SHARED_DIR_MODE, prepare_workspace
from sandbox.runtime.naming import CREATING_MARK, CREATOR_LABEL, Labels
from sandbox.runtime.protocol import Browsers, SandboxInfo
from sandbox.runtime.spec import SandboxSpec
from sandbox.runtime.workspace_ref import Volume

if TYPE_CHECKING:
    from sandbox.runtime.manager import SandboxManager
    from sandbox.runtime.protocol import SandboxFacts

T = TypeVar("T")
SETUP_TIMEOUT_S = 300.0

__all__ = [
    "CONTROL_TIMEOUT_S",
    "CREATING_MARK",
    "CREATOR_LABEL",
    "DockerBackend",
    "DockerSandbox",
    "info_from_container",
]


class DockerBackend:
    """Sandboxes as Docker containers.

    Args:
        client: a docker SDK client; default `docker.from_env()` on first use.
        max_threads: how many blocking SDK calls may run at once.
        timeout_s: how long the default client waits for each answer of the engine.
    """

    name = "docker"

    def __init__(self, client: Any = None, *, max_threads: int = 32, timeout_s: float = CONTROL_TIMEOUT_S) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._limiter = anyio.CapacityLimiter(max_threads)  # engine calls in flight
        self._threads = anyio.CapacityLimiter(max_threads)  # their threads (never the one waited on)
        self.stream_limiter = anyio.CapacityLimiter(256)  # long-running output readers
        self._image_ids: dict[str, tuple[float, str]] = {}
        self.agents = ResidentAgents(DockerAgents(self))
        self.pool_claims: PoolClaims | None = None  # set by the manager that owns the state dir
        # container id -> its workspace's id at creation (bounded: a miss reads the label again)
        self.workspace_ids: OrderedDict[str, str] = OrderedDict()
        self.links = AgentLinkFolders(self)  # each sandbox's folder of agent FIFOs

    # -- plumbing -------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The docker SDK client (created lazily)."""
        if self._client is None:
            self._client = connect(self._timeout_s)
        return self._client

    async def call(self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one blocking SDK call in a worker thread, with errors mapped."""

        def run() -> T:
            with mapped(action):
                return fn(*args, **kwargs)

        # A hung engine holds every thread for the client's timeout: a call waits for one no
        # longer than that either, so it fails in a bounded time however many are queued.
        with anyio.move_on_after(self._timeout_s) as waiting:
            await self._limiter.acquire()
        if waiting.cancelled_caught:
            raise SandboxUnavailable(
                f"{action}: the Docker engine is not answering (all {self._limiter.total_tokens:g} engine "
                f"threads have waited on it for up to {self._timeout_s:g} s)"
            )
        try:
            return await anyio.to_thread.run_sync(run, limiter=self._threads)
        finally:
            self._limiter.release()

    async def ping(self) -> dict[str, Any]:
        """Engine version info, or SandboxUnavailable."""
        version: dict[str, Any] = await self.call("ping", lambda: self.client.version())
        return version

    async def image_id(self, ref: str, *, max_age_s: float = 10.0) -> str:
        """The id of a local image (cached briefly); SandboxUnavailable naming `images build`."""
        cached = self._image_ids.get(ref)
        now = time.monotonic()
        if cached and now - cached[0] < max_age_s:
            return cached[1]

        def get() -> str:
            try:
                return str(self.client.images.get(ref).id)
            except docker.errors.ImageNotFound as exc:
                raise SandboxUnavailable(
                    f"image {ref!r} is not on this engine; build it with `sandbox images build`",
                    image=ref,
                ) from exc

        image = await self.call("inspect image", get)
        self._image_ids[ref] = (now, image)
        return image

    # -- lifecycle ------------------------------------------------------------------------

    async def find(self, name: str) -> dict[str, Any] | None:
        """`docker inspect` of a container by name, or None."""

        def get() -> dict[str, Any] | None:
            try:
                return dict(self.client.api.inspect_container(name))
            except docker.errors.NotFound:
                return None

        return await self.call("inspect container", get)

    async def exists(self, name: str) -> bool:
        """Whether a container of this name exists (running or not)."""
        return await self.find(name) is not None

    async def ensure(self, spec: SandboxSpec) -> DockerSandbox:
        """Adopt a matching container or create one; recreate on drift or death.

        A container of another tenant or scope key under this name (a hash collision, or a
        config that skipped validation) is neither handed out nor removed: SandboxUnavailable.
        """
        attrs = await self.find(spec.name)
        if attrs is not None:
            if await reusable(self, attrs, spec):  # whose, drifted, working (runtime/docker/reuse.py)
                remember(self.workspace_ids, attrs["Id"], recorded_id(attrs["Config"].get("Labels") or {}))
                procfs.hide_in(attrs, spec)  # also one made before hidepid, or restarted (runtime/docker/procfs.py)
                return DockerSandbox(self, attrs["Id"], spec)
            await self.remove(attrs["Id"])
        # the engine gets the protected-path mounts too; the tools keep seeing spec.mounts
        made = await self._create(spec.engine_spec())
        return DockerSandbox(self, made.id, spec)

    async def adopt(self, spec: SandboxSpec) -> DockerSandbox | None:
        """The running container that serves `spec` as it is, never made, restarted or removed
        here (a preview reaches only what runs: api/preview_routes.py); None otherwise."""
        attrs = await self.find(spec.name)
        if attrs is None or not (attrs.get("State") or {}).get("Running"):
            return None
        try:
            if not await reusable(self, attrs, spec):
                return None
        except SandboxUnavailable:  # another tenant's or scope's under this name
            return None
        remember(self.workspace_ids, attrs["Id"], recorded_id(attrs["Config"].get("Labels") or {}))
        return DockerSandbox(self, attrs["Id"], spec)

    def _prepare_workspace(self, spec: SandboxSpec) -> None:
        # no-follow from a trusted root: a planted link cannot aim a root mkdir or chown elsewhere
        if spec.workspace.host_path is not None:  # a volume is the engine's to make
            prepare_workspace(spec)

    async def _create(self, spec: SandboxSpec) -> DockerSandbox:
        egress.MAKING.add(spec.name)  # an orphan sweep meanwhile leaves its proxy alone
        try:
            made = await self._create_marked(spec)
            if spec.egress is not None and not await bridge_guarded(spec):
                with anyio.CancelScope(shield=True):
                    await self.remove(made.id)  # never left running on a bridge open to the host
                raise SandboxUnavailable(
                    "the host firewall rules of the egress network are gone and cannot be put back",
                    container=spec.name,
                )
            return made
        except BaseException:
            if spec.egress is not None:  # whatever failed, the proxy and network made for it go
                with anyio.CancelScope(shield=True):
                    await self.call("remove egress proxy", egress.remove_edge, self.client, spec.name)
            raise
        finally:
            egress.MAKING.discard(spec.name)

    async def _create_marked(self, spec: SandboxSpec) -> DockerSandbox:
        # Created under a temporary name and renamed when ready: the final name existing
        # means "fully set up", and a crash mid-way leaves only a `-creating-` orphan.
        await self.image_id(spec.image, max_age_s=0)
        await anyio.to_thread.run_sync(self._prepare_workspace, spec)
        temp_name = f"{spec.name[:40]}{CREATING_MARK}{uuid.uuid4().hex[:8]}"
        kwargs = create_kwargs(spec)
        kwargs["name"] = temp_name
        kwargs["labels"][CONFIG_KEYS_LABEL] = json.dumps(key_hashes(spec.hashed), sort_keys=True)
        # host, boot, pid and its start time: a pid alone says nothing where every service
        # container is pid 1 on the host's hostname (compose runs it with network_mode: host)
        kwargs["labels"][CREATOR_LABEL] = current_owner()
        made_on = await anyio.to_thread.run_sync(workspace_id, spec)  # the folder just prepared
        kwargs["labels"][WORKSPACE_ID_LABEL] = made_on or ""
        kwargs["mounts"] = [
            DockerMount(m.target, m.source, type="volume", read_only=m.read_only)
            if m.volume
            else DockerMount(m.target, m.source, type="bind", read_only=m.read_only, propagation="rprivate")
            for m in spec.mounts
        ]
        if isinstance(spec.workspace, Volume):  # made with labels (an implicit one would have none); kept if it exists
            labels = {Labels.MANAGED: "true", Labels.INSTANCE: spec.instance, Labels.TENANT: spec.tenant}
            labels[Labels.SCOPE_KEY] = spec.scope_key
            name = spec.workspace.name
            await self.call("create workspace volume", self.client.volumes.create, name=name, labels=labels)
        if spec.docker.ulimits:
            kwargs["ulimits"] = [Ulimit(name=k, soft=v.soft, hard=v.hard) for k, v in spec.docker.ulimits.items()]
        if spec.egress is not None:
            # the proxy and the internal network first: the sandbox is created on that network
            owner = egress.EdgeOwner.of(spec)
            edge = await self.call("create egress proxy", egress_make.create_edge, self.client, owner)
            kwargs["network_mode"] = edge.network
            kwargs["environment"] = {**kwargs.get("environment", {}), **edge.environment()}
            # the embedded resolver forwards what it cannot answer to the proxy, where nothing
            # listens for DNS: never to the host's resolvers (which some engines reach from the
            # host's namespace, CVE-2024-29018)
            kwargs["dns"] = [edge.proxy_address]

        link_folder = await self.links.new_folder(spec)
        if link_folder is not None:  # the agents' FIFOs (runtime/agent/fifo_link.py), read-only
            kwargs["labels"][Labels.AGENT_LINK] = link_folder
            kwargs["mounts"].append(DockerMount(INSIDE, link_folder, type="bind", read_only=True))

        def create_and_start() -> str:
            try:
                container = create_container(self.client, kwargs)
            except docker.errors.APIError as exc:
                if not self.links.unseen(exc, kwargs):
                    raise
                container = create_container(self.client, kwargs)  # without it: the agents keep the stream
            try:
                container.start()
            except Exception:
                container.remove(force=True)
                raise
            return str(container.id)

        try:
            container_id = await self.call("create sandbox", create_and_start)
        except BaseException:
            if link_folder is not None:
                link_folders.remove(link_folder)
            raise
        remember(self.workspace_ids, container_id, made_on or "")
        if link_folder is not None and Labels.AGENT_LINK not in kwargs["labels"]:
            link_folders.remove(link_folder)  # the engine could not see it
            link_folder = None
        self.links.made(container_id, link_folder, spec.user)
        try:
            sandbox = DockerSandbox(self, container_id, spec)
            await procfs.hide_processes(self, container_id, spec)  # before any session runs in it
            if spec.egress is not None:
                ca = await self.call("start egress proxy", egress.wait_ready, self.client, spec.name)
                if ca:  # it decrypts for secrets: the sandbox trusts its CA (and only for that proxy)
                    await self._install_ca(sandbox, spec, ca)
            if isinstance(spec.workspace, Volume) and spec.session_users:
                await self._share_volume(sandbox, spec)
            if spec.docker.setup_command:
                await self._setup(sandbox, spec)
            self.agents.close(container_id, "0")  # the CA install or a root setup ran as root
            await self.call("rename sandbox", lambda: self.client.api.rename(container_id, spec.name))
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self.remove(container_id)
            if isinstance(exc, SandboxError) and exc.code == ErrorCode.CONFLICT:
                # another process won the race for this name: use its container
                attrs = await self.find(spec.name)
                if attrs is not None:
                    return DockerSandbox(self, attrs["Id"], spec)
            raise
        logger.bind(container=spec.name, agent=spec.agent, scope_key=spec.scope_key).info("sandbox_created")
        return sandbox

    async def _install_ca(self, sandbox: DockerSandbox, spec: SandboxSpec, ca: str) -> None:
        """The system CAs plus the egress proxy's, where the sandbox's CA variables point."""
        result = await sandbox.run_argv(["sh", "-c", egress_secrets.INSTALL_SCRIPT, "sh", ca], user="0", timeout_s=30)
        if result.exit_code != 0:
            raise SandboxUnavailable(
                "the egress proxy's CA could not be installed in the sandbox (exit "
                f"{result.exit_code}): {result.output.decode(errors='replace')[-300:]}",
                container=spec.name,
            )

    async def _share_volume(self, sandbox: DockerSandbox, spec: SandboxSpec) -> None:
        """Sessions with uids of their own share a workspace through the sandbox user's group, as
        a host scratch folder is made for them (its owner, the sandbox user, may say so)."""
        mode = f"{SHARED_DIR_MODE:o}"
        result = await sandbox.run_argv(["chmod", mode, CONTAINER_WORKDIR], user=spec.user, timeout_s=30)
        if result.exit_code != 0:
            raise SandboxUnavailable(
                f"the workspace volume could not be shared by the sessions' group (chmod {mode}, exit "
                f"{result.exit_code}): {result.output.decode(errors='replace')[-300:]}",
                container=spec.name,
            )

    async def _setup(self, sandbox: DockerSandbox, spec: SandboxSpec) -> None:
        command = spec.docker.setup_command or ""
        user = "0" if spec.docker.setup_as_root else spec.user
        result = await sandbox.run(
            protocol.RunRequest(command, call_id=f"setup-{uuid.uuid4().hex[:8]}", user=user, timeout_s=SETUP_TIMEOUT_S)
        )
        if result.timed_out or result.exit_code != 0:
            tail = result.output.decode(errors="replace")[-500:]
            raise SandboxUnavailable(
                f"setup_command failed (exit {result.exit_code}{', timed out' if result.timed_out else ''}); "
                f"the container was removed. Output: {tail}",
                container=spec.name,
            )

    async def list(
        self, *, instance: str | None, tenant: str | None = None, kind: str | None = None, label: str | None = None
    ) -> builtins.list[SandboxInfo]:
        """Managed containers (of one instance, or all); with `label` (`key` or `key=value`) only
        those that carry it. The engine filters in memory: at 1,000 sandboxes a listing of the few
        pool members takes 10 ms, of all of them 250-400 ms."""
        filters = [f"{Labels.MANAGED}=true"]
        if instance:
            filters.append(f"{Labels.INSTANCE}={instance}")
        if tenant is not None:
            filters.append(f"{Labels.TENANT}={tenant}")
        if kind:
            filters.append(f"{Labels.KIND}={kind}")
        if label:
            filters.append(label)

        def get() -> builtins.list[dict[str, Any]]:
            return builtins.list(self.client.api.containers(all=True, filters={"label": filters}))

        return [info_from_container(c) for c in await self.call("list sandboxes", get)]

    async def remove(self, name_or_id: str) -> None:
        """Force-remove a container and its anonymous volumes; missing is fine."""

        def rm() -> str:
            try:
                attrs = self.client.api.inspect_container(name_or_id)
            except docker.errors.NotFound:
                return ""
            try:
                self.client.api.remove_container(name_or_id, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if "already in progress" not in str(exc):
                    raise
            netsweep.remove_networks_of(self.client, attrs)  # its egress edge, or its own browser network, goes with it
            folder = folder_in(attrs)
            if folder:
                link_folders.remove(folder)
            return str(attrs.get("Id", ""))

        removed = await self.call("remove sandbox", rm)
        if removed:
            self.agents.forget(removed)
            self.links.forget(removed)
            self.workspace_ids.pop(removed, None)
            if self.pool_claims is not None:
                self.pool_claims.drop(removed)

    async def sweep_egress(self, instance: str) -> builtins.list[str]:
        """Remove egress proxies and networks whose sandbox is gone (see runtime/docker/netsweep.py)."""
        return await self.call("sweep egress proxies", netsweep.sweep_orphans, self.client, instance)

    def browsers(self, instance: str) -> Browsers:
        """Browser sandboxes on this engine (runtime/docker/browser.py)."""
        return BrowserManager(self, instance)

    def freezer(self) -> DockerFreezer:
        """Pausing idle sandboxes with the engine's pause (docker/freeze.py)."""
        return DockerFreezer(self)

    def warm_pool(self, manager: SandboxManager) -> WarmPool:
        """The warm pool on this engine; its claims tell `find` a handed-over member's session."""
        pool = WarmPool(manager, self)
        self.pool_claims = pool.claims
        return pool

    def egress(self) -> DockerEgressLogs:
        """Egress proxies' logs and leftovers on this engine."""
        return DockerEgressLogs(self)

    async def facts(self, name_or_id: str) -> SandboxFacts | None:
        """What `docker inspect` says of a container (runtime/docker/facts.py); None when it is gone."""
        attrs = await self.find(name_or_id)
        return facts_from_container(attrs) if attrs is not None else None

    async def aclose(self) -> None:
        """Close the SDK client's connections."""
        self.agents.close_all()
        if self._client is not None:
            client, self._client = self._client, None
            await anyio.to_thread.run_sync(client.close)
