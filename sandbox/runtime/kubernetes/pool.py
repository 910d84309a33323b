"""The warm pool on a cluster: started Pods per pool key, claimed by one label patch.

A member is a sandbox Pod made before its session exists (labels `pool: <key>`,
`claimed: "false"`, scope `pool`), its resident agent started. A session takes one with ONE
write: a merge patch of its labels and annotations that carries the `resourceVersion` the member
was listed at, so the API server applies it only if nobody changed the Pod since (409 Conflict
otherwise). Two orchestrators racing for one member: exactly one patch is applied; the other
moves on to the next member, or makes a Pod of its own. A Pod cannot be renamed, so a claimed
member keeps its name and says whose it is: `claimed: <the session's sandbox name>` and that
name in full in an annotation, which is how the backend finds it again (runtime/kubernetes/
backend.py). A claimed member is never handed out again: its `claimed` label is no longer
"false", and only Pods that say "false" are listed for a claim.

Only Pods that are this instance's members of the session's pool key, of its tenant, in its
tenant's namespace, running and ready, restricted, and of the shape the session's own Pod would
have are claimed (pods_read.claimable): a Pod planted with the pool's labels is not.

Refilling: after a claim (this process's) at once, and on a watch of the namespaces' sandbox
Pods (another orchestrator's claim, a member deleted or failed), with a full list every
REFILL_EVERY_S as the resync.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio

from sandbox._log import logger
from sandbox.config.merge import EffectiveAgent
from sandbox.errors import SandboxError
from sandbox.runtime import pool_plan
from sandbox.runtime.kubernetes.names import MANAGED_BY, K8sAnnotations, K8sLabels, label_value, namespace_for
from sandbox.runtime.kubernetes.pod import sandbox_pod
from sandbox.runtime.kubernetes.pods_read import claimable, info_of
from sandbox.runtime.kubernetes.sandbox import KubernetesSandbox
from sandbox.runtime.protocol import SandboxInfo
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.kubernetes.backend import KubernetesBackend
    from sandbox.runtime.manager import SandboxManager

REFILL_EVERY_S = 30.0  # the resync: a watch wakes the filler at once, this catches what it missed
WATCH_S = 25  # one watch request's length (the server ends it; the next fill starts another)
LIVE_PHASES = ("Pending", "Running")


def members_selector(instance: str, key: str | None = None) -> str:
    """The label selector of this instance's unclaimed members (of one pool key, or all)."""
    selector = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{K8sLabels.SANDBOX}=true,{K8sLabels.INSTANCE}={instance}"
    selector += f",{K8sLabels.CLAIMED}=false"
    return selector + (f",{K8sLabels.POOL}={key}" if key else "")


def claim_patch(pod: dict[str, Any], spec: SandboxSpec) -> dict[str, Any]:
    """The one write of a claim: the member becomes `spec`'s session's sandbox, only if it is still
    the version that was listed (the `resourceVersion` precondition)."""
    return {
        "metadata": {
            "resourceVersion": pod["metadata"]["resourceVersion"],
            "labels": {
                K8sLabels.CLAIMED: label_value(spec.name),
                K8sLabels.SCOPE: spec.scope,
                K8sLabels.CONFIG_HASH: spec.config_hash,
            },
            "annotations": {
                K8sAnnotations.SANDBOX_NAME: spec.name,
                K8sAnnotations.SESSION: spec.session,
                K8sAnnotations.SCOPE_KEY: spec.scope_key,
                K8sAnnotations.CREATED_AT: datetime.now(UTC).isoformat(timespec="seconds"),
            },
        }
    }


def frees_a_place(what: str, pod: dict[str, Any]) -> bool:
    """Whether a watch event means a pool has one free member fewer (claimed, gone, failed)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not labels.get(K8sLabels.POOL):
        return False
    phase = (pod.get("status") or {}).get("phase")
    return what == "DELETED" or labels.get(K8sLabels.CLAIMED) != "false" or phase not in LIVE_PHASES


class KubernetesWarmPool:
    """The warm pools of one manager on a cluster (the WarmPool capability)."""

    claim_checks_name = False  # a claim patches labels: the manager asks for the session's pod first

    def __init__(self, manager: SandboxManager, backend: KubernetesBackend) -> None:
        self.manager = manager
        self.backend = backend
        self.wake = anyio.Event()

    def pooled_agents(self) -> list[EffectiveAgent]:
        """Configured agents whose sandboxes are pooled (size > 0, sandboxed, session scope)."""
        return pool_plan.pooled_agents(self.manager)

    async def member_spec(self, agent: EffectiveAgent) -> SandboxSpec | None:
        """The spec of a new member of `agent`'s pool (None: its sandboxes are not pooled)."""
        return await pool_plan.member_spec(self.manager, self.backend, agent)

    def as_claimed(self, info: SandboxInfo) -> SandboxInfo:
        """`info` itself: a claimed Pod's labels and annotations already name its session."""
        return info

    def wanted(self, spec: SandboxSpec) -> bool:
        """Whether `spec`'s session may take a member (its agent has a pool, its sandbox is pooled)."""
        return self.manager.pool_size(spec) > 0 and spec.pool_key is not None

    def _namespace(self, tenant: str) -> str:
        return namespace_for(self.backend.cfg, tenant)

    # -- claiming ----------------------------------------------------------------------------

    async def claim(self, spec: SandboxSpec) -> KubernetesSandbox | None:
        """A member handed to `spec`'s session (one patch), or None when none could be."""
        if spec.pool_key is None:
            return None
        api = await self.backend.api()
        namespace = self._namespace(spec.tenant)
        expected = sandbox_pod(spec, self.backend.cfg, namespace)
        try:
            for pod in await api.list("pods", namespace, members_selector(spec.instance, spec.pool_key)):
                if not claimable(pod, spec, expected, spec.pool_key):
                    continue
                name = pod["metadata"]["name"]
                if await api.patch("pods", namespace, name, claim_patch(pod, spec)):
                    self.backend.claimed(spec.name, name, namespace)
                    logger.bind(pod=name, sandbox=spec.name, session=spec.session).info("pool_claimed")
                    return KubernetesSandbox(self.backend, name, spec)
                # 409: another orchestrator (or session) claimed it first; the next one
        finally:
            self.wake.set()  # refill (or fill now, for the next session)
        return None

    # -- filling -----------------------------------------------------------------------------

    async def fill_once(self) -> int:
        """Make the missing members of every pool (after sweeping stale ones); how many were made."""
        await self.sweep()
        made = 0
        api = await self.backend.api()
        for agent in self.pooled_agents():
            try:
                template = await self.member_spec(agent)
            except SandboxError as exc:
                logger.bind(agent=agent.id).warning("pool_unavailable", error=exc.message)
                continue
            if template is None or template.pool_key is None:
                continue
            namespace = self._namespace(agent.tenant)
            members = await api.list("pods", namespace, members_selector(self.manager.instance, template.pool_key))
            # Pending ones count: they are being made (by this orchestrator or another)
            live = [p for p in members if (p.get("status") or {}).get("phase") in LIVE_PHASES]
            missing = min(agent.sandbox.pool.size - len(live), await pool_plan.room(self.manager, self.backend, agent))
            if missing <= 0:
                continue
            made += await pool_plan.make_members(self, self.backend, agent, missing, lambda box, spec: None)
        return made

    async def keep_filled(self) -> None:
        """Fill every pool, then again when a member is claimed or goes (a watch), or every
        REFILL_EVERY_S (a background task)."""
        while True:
            self.wake = anyio.Event()
            try:
                await self.fill_once()
            except Exception as exc:  # the API away, a bad image: said, and tried again later
                logger.warning("pool_fill_failed", error=f"{exc.__class__.__name__}: {exc}")
            with anyio.move_on_after(REFILL_EVERY_S):
                async with anyio.create_task_group() as tg:
                    namespaces = sorted({self._namespace(a.tenant) for a in self.pooled_agents()})
                    for namespace in namespaces:
                        tg.start_soon(self._watch, namespace, tg.cancel_scope)
                    await self.wake.wait()
                    tg.cancel_scope.cancel()

    async def _watch(self, namespace: str, scope: anyio.CancelScope) -> None:
        """Wake the filler when one of this namespace's members is claimed, deleted or fails."""
        api = await self.backend.api()
        selector = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{K8sLabels.INSTANCE}={self.manager.instance}"
        try:
            _, version = await api.list_versioned("pods", namespace, selector)
            async for what, pod in api.watch("pods", namespace, selector, version, WATCH_S):
                if frees_a_place(what, pod):
                    self.wake.set()
                    return
        except SandboxError as exc:  # the resync still comes
            logger.bind(namespace=namespace).warning("pool_watch_failed", error=exc.message)

    # -- sweeping ----------------------------------------------------------------------------

    async def stale(self) -> list[tuple[SandboxInfo, str]]:
        """Unclaimed members that will never be handed out, and why."""
        wanted = await pool_plan.wanted_keys(self)
        api = await self.backend.api()
        out = []
        for namespace in self.backend.namespaces():
            for pod in await api.list("pods", namespace, members_selector(self.manager.instance)):
                info = info_of(pod)
                phase = (pod.get("status") or {}).get("phase")
                if phase not in LIVE_PHASES:
                    out.append((info, f"pool member is {str(phase).lower()} (evicted, or its node went)"))
                elif info.labels.get(K8sLabels.POOL) not in wanted:
                    out.append((info, "pool member of a config that changed (or a pool that is gone)"))
        return out

    async def sweep(self) -> list[str]:
        """Delete the stale members; their names."""
        return await pool_plan.sweep(self)

    async def remove_member(self, info: SandboxInfo) -> None:
        """Delete one member Pod."""
        await self.backend.remove(info.id)
