"""Two orchestrators racing for one warm pool member on a real cluster (scripts/k8s-e2e runs this
with KUBECONFIG set; here, with no API server installable, the test is skipped and says so): both
claims' patches carry the resourceVersion they listed, the API server applies one and refuses the
other (409), so never both get the member, and a claim makes no Pod of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.config import effective_agent
from sandbox.runtime.kubernetes.api import Api
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import K8sAnnotations, K8sLabels, label_value, namespace_for
from sandbox.runtime.kubernetes.pod import sandbox_pod
from sandbox.runtime.kubernetes.pool import KubernetesWarmPool
from sandbox.runtime.manager import SandboxManager
from sandbox.runtime.spec import spec_from_config
from tests.contract import cluster
from tests.contract.cluster import kubectl

pytestmark = cluster.needs_cluster

POOL_INSTANCE = "e2epool"  # the pool race's orchestrators: no other check's Pods carry this instance


@pytest.mark.anyio
@pytest.mark.timeout(600)
async def test_two_orchestrators_race_for_one_pool_member_and_each_wins_at_most_one(
    prepared: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = cluster.config(tmp_path, POOL_INSTANCE, "acme", {"pool": {"size": 1}})
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    assert namespace == namespace_for(prepared.runtime.kubernetes, "acme")  # its objects are applied
    ours = f"{K8sLabels.INSTANCE}={POOL_INSTANCE}"
    kubectl("-n", namespace, "delete", "pods", "-l", ours, "--ignore-not-found", "--grace-period=0")  # an earlier run's
    backends = [KubernetesBackend(config), KubernetesBackend(config)]  # two orchestrators, one cluster
    pools: list[KubernetesWarmPool] = []
    for backend in backends:
        pool = SandboxManager(config, backend).pool
        assert isinstance(pool, KubernetesWarmPool)
        pools.append(pool)
    try:
        agent = effective_agent(config, "main")
        member = await pools[0].member_spec(agent)
        assert member is not None
        pod = sandbox_pod(member, config.runtime.kubernetes, namespace)
        assert kubectl("apply", "-f", "-", stdin=json.dumps(pod)).returncode == 0
        assert cluster.ready(namespace, member.name), cluster.events(namespace, member.name)
        # a status write by the kubelet between the list and the patches would refuse both (409):
        # the race is run on a member nobody else is writing to
        assert cluster.settled(namespace, member.name), "the member's resourceVersion kept changing for 30 s"
        # each claim's patch is held until both were sent: both carry the resourceVersion they
        # listed, and the API server alone decides which one is applied
        sent: list[str] = []
        both_sent = anyio.Event()
        outcomes: list[bool] = []

        def hold(api: Api) -> None:
            patch = api.patch

            async def held(kind: str, where: str, pod_name: str, body: dict[str, Any]) -> bool:
                sent.append(pod_name)
                if len(sent) >= 2:
                    both_sent.set()
                with anyio.move_on_after(30):
                    await both_sent.wait()
                applied = await patch(kind, where, pod_name, body)
                outcomes.append(applied)
                return applied

            monkeypatch.setattr(api, "patch", held)

        for backend in backends:
            hold(await backend.api())
        image = agent.sandbox.docker.image
        specs = {
            s: spec_from_config(config, agent, s, POOL_INSTANCE, image_id=image)
            for s in ("agent:main:a", "agent:main:b")
        }
        got: dict[str, str | None] = {}

        async def claim(pool: KubernetesWarmPool, session: str) -> None:
            box = await pool.claim(specs[session])
            got[session] = box.id if box is not None else None

        async with anyio.create_task_group() as tg:
            for pool, session in zip(pools, specs, strict=True):
                tg.start_soon(claim, pool, session)
        winners = [session for session, pod_name in got.items() if pod_name is not None]
        assert len(winners) == 1 and got[winners[0]] == member.name, got  # one has it, the other none
        # both tried the one member at once: one patch applied, the other refused (409)
        assert sent == [member.name, member.name] and sorted(outcomes) == [False, True], (sent, outcomes)
        live = cluster.kubectl_json("-n", namespace, "get", "pod", member.name) or {}
        winner = specs[winners[0]].name
        assert live["metadata"]["labels"][K8sLabels.CLAIMED] == label_value(winner), live["metadata"]
        assert live["metadata"]["annotations"][K8sAnnotations.SANDBOX_NAME] == winner, live["metadata"]
        # the claimed member is never listed for a claim again, and a claim makes no Pod of its own
        late = spec_from_config(config, agent, "agent:main:late", POOL_INSTANCE, image_id=image)
        assert await pools[1].claim(late) is None
        listed = kubectl("-n", namespace, "get", "pods", "-l", ours, "-o", "name").stdout.split()
        assert listed == [f"pod/{member.name}"], listed
    finally:
        for backend in backends:
            await backend.aclose()
        kubectl("-n", namespace, "delete", "pods", "-l", ours, "--ignore-not-found", "--grace-period=0")
