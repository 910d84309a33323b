"""The warm pool on a cluster, against the fake API (tests/k8s_fake_cluster.py) with members planted
as objects: claims are one label patch with a resourceVersion precondition, two orchestrators
racing get one member each, a claimed member never goes to a second session, and a Pod that is
not this instance's own ready, restricted member is never claimed (no engine needed: nothing is
exec'd; tests/test_k8s_pool_docker.py runs members as real containers)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.config import load_config_text
from sandbox.config.merge import effective_agent
from sandbox.config.models import Config
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import K8sAnnotations, K8sLabels, label_value, namespace_for
from sandbox.runtime.kubernetes.pod import sandbox_pod
from sandbox.runtime.kubernetes.pool import KubernetesWarmPool, frees_a_place, members_selector
from sandbox.runtime.manager import SandboxManager
from sandbox.runtime.spec import SandboxSpec, spec_from_config
from tests.k8s_fake_cluster import FakeCluster

pytestmark = pytest.mark.anyio


def _config(tmp_path: Path) -> Config:
    return load_config_text(
        f"""
state_dir: {tmp_path / "state"}
instance: poolk8s
runtime:
  backend: kubernetes
  kubernetes: {{seccomp: "Localhost:agent-sandbox/strict.json"}}
tenants: [{{id: acme}}, {{id: rival}}]
agents:
  defaults:
    sandbox: {{mode: all, scope: session, workspace_access: none, pool: {{size: 2}}}}
  list:
    - {{id: main, tenant: acme, default: true, workspace: {tmp_path / "ws-main"}}}
    - {{id: other, tenant: rival, workspace: {tmp_path / "ws-other"}}}
""",
        base_dir=tmp_path,
    )


class Orchestrators:
    """Backends on one fake cluster, each with its manager and warm pool (one per orchestrator)."""

    def __init__(self, cluster: FakeCluster, config: Config) -> None:
        self.cluster, self.config = cluster, config
        self.backends: list[KubernetesBackend] = []
        for tenant in ("acme", "rival"):
            cluster.namespaces.add(namespace_for(config.runtime.kubernetes, tenant))

    def pool(self) -> KubernetesWarmPool:
        backend = KubernetesBackend(self.config, api=self.cluster.api())
        self.backends.append(backend)
        pool = SandboxManager(self.config, backend).pool
        assert isinstance(pool, KubernetesWarmPool)
        return pool

    def session_spec(self, session: str, agent: str = "main") -> SandboxSpec:
        found = effective_agent(self.config, agent)
        return spec_from_config(self.config, found, session, "poolk8s", image_id=found.sandbox.docker.image)

    async def member(self, pool: KubernetesWarmPool, agent: str = "main", **status: Any) -> dict[str, Any]:
        """A member Pod as the filler renders it, planted as running and ready (or as `status`)."""
        spec = await pool.member_spec(effective_agent(self.config, agent))
        assert spec is not None
        pod = sandbox_pod(
            spec, self.config.runtime.kubernetes, namespace_for(self.config.runtime.kubernetes, spec.tenant)
        )
        return self.plant(pod, **status)

    def plant(self, pod: dict[str, Any], phase: str = "Running", ready: bool = True) -> dict[str, Any]:
        pod = copy.deepcopy(pod)
        meta = pod["metadata"]
        pod["status"] = {"phase": phase, "containerStatuses": [{"name": "sandbox", "ready": ready, "state": {}}]}
        self.cluster.objects[("pods", meta["namespace"], meta["name"])] = pod
        self.cluster.changed("pods", meta["namespace"], pod, "ADDED")
        return pod

    def patches(self) -> int:
        return sum(1 for method, _ in self.cluster.requests if method == "PATCH")

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()


@pytest.fixture
async def orchs(tmp_path: Path) -> AsyncIterator[Orchestrators]:
    async with FakeCluster() as cluster:
        made = Orchestrators(cluster, _config(tmp_path))
        try:
            yield made
        finally:
            await made.aclose()


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_claim_is_one_patch_carrying_the_listed_resource_version(orchs: Orchestrators) -> None:
    """One write per claim; the member then names its session, and a stale version is refused (409)."""
    pool = orchs.pool()
    member = await orchs.member(pool)
    listed_version = member["metadata"]["resourceVersion"]
    spec = orchs.session_spec("agent:main:s1")
    writes = orchs.cluster.writes()
    box = await pool.claim(spec)
    assert box is not None and box.id == member["metadata"]["name"]
    assert orchs.cluster.writes() - writes == 1  # the target is <= 2 API writes per claim
    live = orchs.cluster.objects[("pods", member["metadata"]["namespace"], box.id)]
    assert live["metadata"]["labels"][K8sLabels.CLAIMED] == label_value(spec.name)
    assert live["metadata"]["annotations"][K8sAnnotations.SANDBOX_NAME] == spec.name
    assert live["metadata"]["resourceVersion"] != listed_version
    api = await pool.backend.api()
    stale = {"metadata": {"resourceVersion": listed_version, "labels": {K8sLabels.CLAIMED: "false"}}}
    assert await api.patch("pods", member["metadata"]["namespace"], box.id, stale) is False
    assert live["metadata"]["labels"][K8sLabels.CLAIMED] == label_value(spec.name)  # the 409 changed nothing


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_two_orchestrators_racing_for_one_member_get_one_each(orchs: Orchestrators) -> None:
    """Both patch the same member at once: exactly one wins, the loser takes the next member."""
    first, second = orchs.pool(), orchs.pool()
    members = sorted([(await orchs.member(first))["metadata"]["name"] for _ in range(2)])
    orchs.cluster.hold_patches = 2  # both patches reach the server before either is applied
    got: dict[str, str | None] = {}

    async def claim(pool: KubernetesWarmPool, session: str) -> None:
        box = await pool.claim(orchs.session_spec(session))
        got[session] = box.id if box is not None else None

    async with anyio.create_task_group() as tg:
        tg.start_soon(claim, first, "agent:main:a")
        tg.start_soon(claim, second, "agent:main:b")
    assert sorted(v for v in got.values() if v) == members  # one each, never the same one
    assert orchs.patches() == 3  # both on the first member, the loser (409) once more on the second
    owners = [orchs.cluster.objects[k]["metadata"]["labels"][K8sLabels.CLAIMED] for k in orchs.cluster.objects]
    assert len(set(owners)) == 2


async def test_a_claimed_member_is_never_handed_out_twice(orchs: Orchestrators) -> None:
    """Six sessions of three orchestrators race for two members: two get one each, four get none
    (they make a Pod of their own), and no later claim gets a claimed member."""
    pools = [orchs.pool() for _ in range(3)]
    for _ in range(2):
        await orchs.member(pools[0])
    got: list[str | None] = []

    async def claim(pool: KubernetesWarmPool, session: str) -> None:
        box = await pool.claim(orchs.session_spec(session))
        got.append(box.id if box is not None else None)

    async with anyio.create_task_group() as tg:
        for n in range(6):
            tg.start_soon(claim, pools[n % 3], f"agent:main:r{n}")
    won = [g for g in got if g]
    assert len(won) == 2 and len(set(won)) == 2 and got.count(None) == 4
    assert await pools[1].claim(orchs.session_spec("agent:main:late")) is None


async def test_only_this_instances_own_ready_restricted_members_are_claimed(orchs: Orchestrators) -> None:
    """Attacks: Pods planted with the pool's labels but not ours, and members not serving, are
    never claimed (nothing is patched); another tenant's namespace is never looked in."""
    pool = orchs.pool()
    template = await orchs.member(pool)
    orchs.cluster.objects.pop(("pods", template["metadata"]["namespace"], template["metadata"]["name"]))

    def variant(name: str, change: Any) -> dict[str, Any]:
        pod = copy.deepcopy(template)
        pod["metadata"]["name"] = name
        change(pod)
        return pod

    def box(pod: dict[str, Any]) -> dict[str, Any]:
        container: dict[str, Any] = pod["spec"]["containers"][0]
        return container

    planted = [
        variant("other-image", lambda p: box(p).update(image="evil:latest")),
        variant(
            "privileged", lambda p: box(p)["securityContext"].update(privileged=True, allowPrivilegeEscalation=True)
        ),
        variant("root", lambda p: p["spec"]["securityContext"].update(runAsUser=0, runAsNonRoot=False)),
        variant("more-args", lambda p: box(p).update(args=["sh", "-c", "steal"])),
        variant("token", lambda p: p["spec"].update(automountServiceAccountToken=True)),
        variant("host-net", lambda p: p["spec"].update(hostNetwork=True)),
        variant("other-instance", lambda p: p["metadata"]["labels"].update({K8sLabels.INSTANCE: "someone"})),
        variant("other-tenant", lambda p: p["metadata"]["annotations"].update({K8sAnnotations.TENANT: "rival"})),
        variant("deleting", lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z")),
        variant("extra-volume", lambda p: p["spec"]["volumes"].append({"name": "x", "emptyDir": {}})),
    ]
    for pod in planted:
        orchs.plant(pod)
    orchs.plant(variant("pending", lambda p: None), phase="Pending", ready=False)
    orchs.plant(variant("not-ready", lambda p: None), ready=False)
    # a perfect member of acme's pool key, but in the rival tenant's namespace
    rival_ns = namespace_for(orchs.config.runtime.kubernetes, "rival")
    orchs.plant(variant("in-rival-ns", lambda p: p["metadata"].update(namespace=rival_ns)))
    assert await pool.claim(orchs.session_spec("agent:main:victim")) is None
    assert orchs.patches() == 0
    # the same shape, planted right, is claimed: the refusals above were about what differed
    orchs.plant(variant("good", lambda p: None))
    claimed = await pool.claim(orchs.session_spec("agent:main:victim"))
    assert claimed is not None and claimed.id == "good"


async def test_a_restarted_orchestrator_finds_the_claimed_pod_by_its_session(orchs: Orchestrators) -> None:
    """A Pod cannot be renamed: a new backend finds the claimed Pod under the session's sandbox
    name (exists, list), adopts it, and removing the session deletes that Pod."""
    pool = orchs.pool()
    member = await orchs.member(pool)
    spec = orchs.session_spec("agent:main:kept")
    assert (await pool.claim(spec)) is not None
    fresh = orchs.pool().backend
    assert await fresh.exists(spec.name)
    listed = await fresh.list(instance="poolk8s")
    assert [(i.name, i.id, i.scope, i.session) for i in listed] == [
        (spec.name, member["metadata"]["name"], "session", "agent:main:kept")
    ]
    adopted = await fresh.ensure(spec)
    assert adopted.id == member["metadata"]["name"]
    assert orchs.cluster.writes() == 1  # adopted: nothing made, nothing replaced
    await fresh.remove(spec.name)
    assert [k for k in orchs.cluster.objects if k[0] == "pods"] == []


async def test_a_watch_wakes_the_filler_when_another_orchestrator_claims(orchs: Orchestrators) -> None:
    """The filler's watch sees a member claimed elsewhere and wakes the refill."""
    filler, claimer = orchs.pool(), orchs.pool()
    await orchs.member(filler)
    namespace = namespace_for(orchs.config.runtime.kubernetes, "acme")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(filler._watch, namespace, tg.cancel_scope)
            await anyio.sleep(0.2)  # the watch is open (its events start after its list anyway)
            assert not filler.wake.is_set()
            assert await claimer.claim(orchs.session_spec("agent:main:elsewhere")) is not None
            await filler.wake.wait()


async def test_stale_members_are_swept(orchs: Orchestrators) -> None:
    """Members of a pool no config wants, or failed, are deleted; a good one stays."""
    pool = orchs.pool()
    good = await orchs.member(pool)
    changed = copy.deepcopy(good)
    changed["metadata"]["name"] = "old-config"
    changed["metadata"]["labels"][K8sLabels.POOL] = "0" * 24
    orchs.plant(changed)
    failed = copy.deepcopy(good)
    failed["metadata"]["name"] = "evicted"
    orchs.plant(failed, phase="Failed", ready=False)
    assert sorted(await pool.sweep()) == ["evicted", "old-config"]
    assert [k[2] for k in orchs.cluster.objects if k[0] == "pods"] == [good["metadata"]["name"]]


def test_a_cluster_sandbox_has_one_pool_key_for_every_session_of_a_tenant(tmp_path: Path) -> None:
    """Pods are pooled on a cluster (workspace on the Pod, not a host folder): the key ignores the
    session and differs by tenant; the member's labels say it is free."""
    config = _config(tmp_path)
    orch = Orchestrators.__new__(Orchestrators)
    orch.config = config
    a, b = orch.session_spec("agent:main:one"), orch.session_spec("agent:main:two")
    assert a.pool_key is not None and a.pool_key == b.pool_key
    assert orch.session_spec("agent:other:one", agent="other").pool_key != a.pool_key
    member = a.as_pool_member()
    labels = sandbox_pod(member, config.runtime.kubernetes, "ns")["metadata"]["labels"]
    assert labels[K8sLabels.POOL] == a.pool_key and labels[K8sLabels.CLAIMED] == "false"
    assert labels[K8sLabels.SCOPE] == "pool"
    assert members_selector("i", "k").endswith(f"{K8sLabels.CLAIMED}=false,{K8sLabels.POOL}=k")


def test_which_watch_events_free_a_place() -> None:
    """A member claimed, deleted or failed frees a place; a status change of a free one does not."""
    free: dict[str, Any] = {
        "metadata": {"labels": {K8sLabels.POOL: "k", K8sLabels.CLAIMED: "false"}},
        "status": {"phase": "Running"},
    }
    claimed = copy.deepcopy(free)
    claimed["metadata"]["labels"][K8sLabels.CLAIMED] = "sbx-x"
    failed = copy.deepcopy(free)
    failed["status"]["phase"] = "Failed"
    assert not frees_a_place("MODIFIED", free) and not frees_a_place("ADDED", free)
    assert frees_a_place("MODIFIED", claimed) and frees_a_place("MODIFIED", failed)
    assert frees_a_place("DELETED", free)
    assert not frees_a_place("DELETED", {"metadata": {"labels": {}}})  # not a pool Pod


async def test_a_tenants_listing_reads_its_own_namespace_only(orchs: Orchestrators) -> None:
    """`list(tenant=...)` (the quota admission, GET /v1/sandboxes) asks for that tenant's
    namespace only: a neighbour's Pods are neither read nor returned."""
    pool = orchs.pool()
    acme = await orchs.member(pool, "main")
    rival = await orchs.member(pool, "other")
    backend = orchs.pool().backend
    assert {i.id for i in await backend.list(instance="poolk8s")} == {
        acme["metadata"]["name"],
        rival["metadata"]["name"],
    }
    orchs.cluster.requests.clear()
    listed = await backend.list(instance="poolk8s", tenant="acme")
    assert [(i.id, i.tenant) for i in listed] == [(acme["metadata"]["name"], "acme")]
    read = {path for method, path in orchs.cluster.requests if method == "GET"}
    assert read and all(acme["metadata"]["namespace"] in path for path in read), read
    assert [i.id for i in await backend.list(instance="poolk8s", tenant="rival")] == [rival["metadata"]["name"]]
    # a Pod of rival's in acme's namespace (a fixed, shared namespace; a renamed tenant's leftovers)
    stray = copy.deepcopy(rival)
    stray["metadata"].update(name="stray", namespace=acme["metadata"]["namespace"])
    orchs.plant(stray)
    assert [i.id for i in await backend.list(instance="poolk8s", tenant="acme")] == [acme["metadata"]["name"]]
