"""Kills on a cluster, step by step, against the fake API whose Pods are real containers: the
agent's signal frame and tag kill; when the agent is gone, a one-shot `pods/exec` of its own;
when that fails too, the Pod is deleted and the result says so. Faults are made by replacing
only what must fail (the agent's registry, the one-shot exec); the processes are real."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from sandbox.config.merge import effective_agent
from sandbox.engine.orchestrator import Orchestrator
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.agent.link import AgentUnavailable
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.kubernetes.sandbox import KILL_NOT_CONFIRMED, KubernetesSandbox
from sandbox.runtime.protocol import RunRequest
from tests.conftest import RUN_ID, TEST_LABEL
from tests.k8s_fake_cluster import FakeCluster
from tests.test_k8s_backend_docker import k8s_config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

SLOW = "echo started; sleep 300 & sleep 300"


@pytest.fixture
async def cluster(docker_client: Any, images: None) -> AsyncIterator[FakeCluster]:
    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, RUN_ID)) as fake:
        yield fake


async def _no_agent(*_: object) -> NoReturn:
    raise AgentUnavailable("the agent vanished (test fault)")


async def _no_exec(*_: object) -> NoReturn:
    raise SandboxUnavailable("pods/exec refused (test fault)")


class Pod:
    """A session's sandbox Pod on the fake cluster, and what the test reads of it."""

    def __init__(self, cluster: FakeCluster, backend: KubernetesBackend, box: KubernetesSandbox, namespace: str):
        self.cluster, self.backend, self.box, self.namespace = cluster, backend, box, namespace

    def sleepers(self) -> int:
        """`sleep 300` processes left in the Pod's container (asked of the engine, not the agent)."""
        ps = subprocess.run(
            ["docker", "exec", self.cluster.container_name(self.namespace, self.box.id), "ps", "-eo", "args"],
            capture_output=True,
            text=True,
            check=True,
        )
        return sum(1 for line in ps.stdout.splitlines() if line.startswith("sleep 300"))

    def exists(self) -> bool:
        return ("pods", self.namespace, self.box.id) in self.cluster.objects


@pytest.fixture
async def pod(tmp_path: Path, cluster: FakeCluster) -> AsyncIterator[Pod]:
    config = k8s_config(tmp_path)
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    cluster.namespaces.add(namespace)
    backend = KubernetesBackend(config, api=cluster.api())
    async with Orchestrator(config, backend, journal=False) as orch:
        box = await orch.manager.sandbox_for(effective_agent(config, "main"), "agent:main:kill")
        assert isinstance(box, KubernetesSandbox)
        yield Pod(cluster, backend, box, namespace)


async def test_without_the_agent_a_one_shot_exec_kills_the_call(pod: Pod, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent is gone when the call outlives its time: a one-shot exec of the kill script
    ends everything the call started, and the Pod is kept."""

    def agent_vanishes(_: bytes) -> None:
        monkeypatch.setattr(pod.backend.agents, "link", _no_agent)

    result = await pod.box.run(RunRequest(SLOW, call_id="kill1", timeout_s=2, on_output=agent_vanishes))
    assert result.timed_out and result.notes == ()  # confirmed: no Pod deletion needed
    assert pod.sleepers() == 0 and pod.exists()
    commands = [" ".join(v for k, v in e["query"] if k == "command") for e in pod.cluster.execs]
    assert [c for c in commands if "kill1" in c], commands[-3:]  # the kill went over an exec of its own


async def test_when_no_kill_can_be_confirmed_the_pod_is_deleted(pod: Pod, monkeypatch: pytest.MonkeyPatch) -> None:
    """No agent and no one-shot exec: the Pod goes, and the result says why."""

    def everything_fails(_: bytes) -> None:
        monkeypatch.setattr(pod.backend.agents, "link", _no_agent)
        monkeypatch.setattr(pod.backend, "exec_once", _no_exec)

    result = await pod.box.run(RunRequest(SLOW, call_id="kill2", timeout_s=2, on_output=everything_fails))
    assert result.timed_out and KILL_NOT_CONFIRMED in result.notes
    assert not pod.exists() and pod.box.gone


async def test_the_agents_link_kills_a_call_whose_stream_was_cut(pod: Pod) -> None:
    """The agent's stream is cut mid-call (its link dies): a fresh agent link runs the kill, the
    signal frame and tag kill reach the work, and the Pod stays."""

    def cut(_: bytes) -> None:
        pod.backend.agents.close_all()

    with pytest.raises(AgentUnavailable):
        await pod.box.run(RunRequest(SLOW, call_id="kill3", timeout_s=30, on_output=cut))
    assert pod.sleepers() == 0 and pod.exists()
