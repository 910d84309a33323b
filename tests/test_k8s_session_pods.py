"""Sessions with a uid of their own on a cluster (agent scope, session users): exec cannot choose
a user under Pod Security restricted, so each such session gets a Pod of its own, running as its
uid, on the agent's workspace claim. Against the fake API whose Pods are real containers and
whose claims are shared host folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox.engine.orchestrator import Orchestrator
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import K8sLabels, namespace_for
from sandbox.runtime.kubernetes.pss import violations
from tests.conftest import RUN_ID
from tests.k8s_fake_cluster import FakeCluster
from tests.k8s_helpers import one_agent_config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def _out(result: Any) -> str:
    assert result.ok, result.error
    output = result.output
    return str(output["output"] if isinstance(output, dict) and "output" in output else output)


async def test_each_session_with_its_own_uid_gets_a_pod_on_the_shared_claim(
    tmp_path: Path, fake_cluster: FakeCluster
) -> None:
    """Two sessions of one agent run as two uids in two Pods (both restricted), share the
    workspace, a timeout kills only the caller's work, and removing the sandbox takes them all."""
    cluster = fake_cluster
    sandbox = '{mode: all, scope: agent, workspace_access: rw, session_users: "on"}'
    config = one_agent_config(tmp_path, f"{RUN_ID}u", sandbox)
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    cluster.namespaces.add(namespace)
    backend = KubernetesBackend(config, api=cluster.api())
    async with Orchestrator(config, backend, journal=False) as orch:
        one, two = orch.session(agent="main", key="agent:main:u1"), orch.session(agent="main", key="agent:main:u2")
        uid_one = int(_out(await one.call("exec", {"command": "id -u; echo from-one > shared.txt"})).split()[0])
        uid_two = int(_out(await two.call("exec", {"command": "id -u"})).split()[0])
        assert uid_one != uid_two and min(uid_one, uid_two) >= 20000
        assert "from-one" in _out(await two.call("read", {"path": "shared.txt"}))  # one claim, shared
        pods = {k[2]: obj for k, obj in cluster.objects.items() if k[0] == "pods"}
        sessions = {n: p for n, p in pods.items() if K8sLabels.USER_OF in p["metadata"]["labels"]}
        assert sorted(p["spec"]["securityContext"]["runAsUser"] for p in sessions.values()) == sorted(
            [uid_one, uid_two]
        )
        (main,) = set(pods) - set(sessions)
        for pod in pods.values():
            assert violations(pod, "restricted", "v1.33") == []
            claims = [
                v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v
            ]
            assert claims == [next(iter(claims))]
        slow = await one.call("exec", {"command": "sleep 300 & sleep 300", "timeout_s": 1})
        assert not slow.ok and slow.error.code == "TIMEOUT"
        assert _out(await one.call("exec", {"command": "ps -eo args | grep -c '^sleep 300' || true"})).strip() == "0"
        assert set(pods) <= {k[2] for k in cluster.objects if k[0] == "pods"}  # the kill needed no Pod deleted
        await backend.remove(main)
        assert [k for k in cluster.objects if k[0] == "pods"] == []
        assert not set(pods) & set(backend._namespace_of)  # nothing kept per Pod gone


async def test_closing_a_session_removes_its_own_pod_and_only_it(tmp_path: Path, fake_cluster: FakeCluster) -> None:
    """What a closed session left running goes with its Pod (a Pod per session uid here); the
    agent's Pod, its claim and the other session's Pod stay."""
    cluster = fake_cluster
    sandbox = '{mode: all, scope: agent, workspace_access: rw, session_users: "on"}'
    config = one_agent_config(tmp_path, f"{RUN_ID}c", sandbox)
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    cluster.namespaces.add(namespace)
    backend = KubernetesBackend(config, api=cluster.api())
    async with Orchestrator(config, backend, journal=False) as orch:
        leaver, stayer = (
            orch.session(agent="main", key="agent:main:c1"),
            orch.session(agent="main", key="agent:main:c2"),
        )
        _out(await leaver.call("exec", {"command": "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo started"}))
        _out(await stayer.call("exec", {"command": "echo here > kept.txt"}))
        pods = {k[2]: obj for k, obj in cluster.objects.items() if k[0] == "pods"}
        leaver_uid = int(_out(await leaver.call("exec", {"command": "id -u"})).strip())
        (leaver_pod,) = [n for n, p in pods.items() if p["spec"]["securityContext"].get("runAsUser") == leaver_uid]
        await leaver.close()
        left = {k[2] for k in cluster.objects if k[0] == "pods"}
        assert left == set(pods) - {leaver_pod}
        assert "here" in _out(await stayer.call("read", {"path": "kept.txt"}))
        assert [k for k in cluster.objects if k[0] == "persistentvolumeclaims"]  # the claim stays
        for name in left:
            await backend.remove(name)
