"""The warm pool on a cluster end to end, against the fake API whose Pods are real containers: two
orchestrators fill and claim through the ordinary session path (the tools do not know the
backend), a claimed member runs the session's commands, the watch refills, and closing the
session deletes the claimed Pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.engine.orchestrator import Orchestrator
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import K8sLabels, namespace_for
from tests.conftest import RUN_ID
from tests.k8s_fake_cluster import FakeCluster
from tests.k8s_helpers import one_agent_config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def _config(tmp_path: Path) -> Any:
    sandbox = "{mode: all, scope: session, workspace_access: none, pool: {size: 2}}"
    return one_agent_config(tmp_path, f"{RUN_ID}p", sandbox)


def _pods(cluster: FakeCluster) -> dict[str, dict[str, str]]:
    return {k[2]: obj["metadata"]["labels"] for k, obj in cluster.objects.items() if k[0] == "pods"}


def _free(cluster: FakeCluster) -> list[str]:
    return [name for name, labels in _pods(cluster).items() if labels.get(K8sLabels.CLAIMED) == "false"]


async def test_sessions_of_two_orchestrators_take_warm_pods_and_the_watch_refills(
    tmp_path: Path, fake_cluster: FakeCluster
) -> None:
    """Filled members are real Pods with their agent up; a session's first call runs in one
    (no Pod made for it), another orchestrator's session gets the other, the pool refills."""
    cluster = fake_cluster
    config = _config(tmp_path)
    cluster.namespaces.add(namespace_for(config.runtime.kubernetes, "acme"))
    first = Orchestrator(config, KubernetesBackend(config, api=cluster.api()), journal=False)
    second = Orchestrator(config, KubernetesBackend(config, api=cluster.api()), journal=False)
    async with first, second:
        assert await first.fill_pools() == 2
        members = sorted(_free(cluster))
        assert len(members) == 2
        one = first.session(agent="main", key="agent:main:w1")
        ran = await one.call("exec", {"command": "echo mine > f.txt && cat f.txt && id -u"})
        assert ran.ok, ran.error
        assert "mine" in str(ran.output) and "1000" in str(ran.output)
        assert sorted(_pods(cluster)) == members  # the session's Pod is a member: none was made
        two = second.session(agent="main", key="agent:main:w2")
        other = await two.call("exec", {"command": "cat f.txt 2>/dev/null || echo fresh"})
        assert other.ok and "fresh" in str(other.output)  # the other member: nothing of w1 in it
        assert _free(cluster) == [] and sorted(_pods(cluster)) == members
        claimers = {labels[K8sLabels.CLAIMED] for labels in _pods(cluster).values()}
        assert len(claimers) == 2
        # the filler of the first orchestrator sees the claims (its own and the watch's) and refills
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first.keep_pools_filled)
                while len(_free(cluster)) < 2:
                    await anyio.sleep(0.2)
                tg.cancel_scope.cancel()
        listed = {i.name: i for i in await first.backend.list(instance=config.instance)}
        sessions = {i.session for i in listed.values() if i.scope == "session"}
        assert sessions == {"agent:main:w1", "agent:main:w2"}
        await one.close()
        await two.close()
        assert len(_pods(cluster)) == 2 and len(_free(cluster)) == 2  # the claimed Pods went
