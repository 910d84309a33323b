"""`provider: agent-sandbox`, driven by the backend against the fake API extended with that
project's objects and a small controller (tests/k8s_fake_agent_sandbox.py): a session's sandbox is
a SandboxClaim of the agent's SandboxWarmPool, its Pod the one the claim's Sandbox adopted, used
only when it is the Pod this orchestrator renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox.config.merge import effective_agent
from sandbox.config.models import Config
from sandbox.engine.orchestrator import Orchestrator
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.spec import spec_from_config
from tests.conftest import RUN_ID
from tests.k8s_fake_cluster import FakeCluster
from tests.k8s_helpers import one_agent_config

pytestmark = pytest.mark.anyio


def _config(tmp_path: Path, timeout_s: int = 60) -> Config:
    sandbox = "{mode: all, scope: session, workspace_access: none, pool: {size: 2}}"
    return one_agent_config(tmp_path, f"{RUN_ID}a", sandbox, "provider: agent-sandbox", timeout_s)


def _kinds(cluster: FakeCluster) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for kind, _, name in cluster.objects:
        found.setdefault(kind, []).append(name)
    return found


@pytest.mark.docker
async def test_a_session_runs_in_the_pod_its_sandbox_claim_got(tmp_path: Path, fake_cluster: FakeCluster) -> None:
    """Template, warm pool and claim are made; the session's commands run in the adopted Pod; a
    restarted orchestrator finds the claim again; closing the session deletes the claim and Pod."""
    cluster = fake_cluster
    config = _config(tmp_path)
    cluster.namespaces.add(namespace_for(config.runtime.kubernetes, "acme"))
    async with Orchestrator(config, KubernetesBackend(config, api=cluster.api()), journal=False) as orch:
        session = orch.session(agent="main", key="agent:main:p1")
        ran = await session.call("exec", {"command": "id -u; echo kept > f.txt"})
        assert ran.ok and "1000" in str(ran.output), ran.error
        kinds = _kinds(cluster)
        assert len(kinds["sandboxtemplates"]) == len(kinds["sandboxwarmpools"]) == len(kinds["sandboxclaims"]) == 1
        (pod,) = kinds["pods"]
        assert pod != kinds["sandboxclaims"][0]  # the adopted Pod, named by the Sandbox's annotation
        listed = await orch.backend.list(instance=config.instance)
        assert [(i.id, i.session) for i in listed] == [(pod, "agent:main:p1")]
    async with Orchestrator(config, KubernetesBackend(config, api=cluster.api()), journal=False) as again:
        session = again.session(agent="main", key="agent:main:p1")
        seen = await session.call("exec", {"command": "cat f.txt"})
        assert seen.ok and "kept" in str(seen.output), seen.error  # the same Pod, adopted
        assert _kinds(cluster)["pods"] == [pod]
        await session.close()
    assert "pods" not in _kinds(cluster) and "sandboxclaims" not in _kinds(cluster)


async def test_a_claim_bound_to_a_pod_that_is_not_ours_is_refused_and_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone changed the SandboxTemplate (a privileged Pod, another image): the claim's Pod is
    not the rendered one, so it is never used and the claim goes."""
    config = _config(tmp_path)
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    async with FakeCluster(namespaces={namespace}) as cluster:  # objects only: nothing is exec'd
        backend = KubernetesBackend(config, api=cluster.api())
        spec = spec_from_config(config, effective_agent(config, "main"), "agent:main:x", config.instance or "")
        original = cluster.add

        async def tampered(kind: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
            if kind == "sandboxtemplates":  # what a writer of templates could do
                obj["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "evil:latest"
            return await original(kind, ns, obj)

        monkeypatch.setattr(cluster, "add", tampered)
        try:
            with pytest.raises(SandboxUnavailable, match="not the Pod this orchestrator renders"):
                await backend.ensure(spec)
        finally:
            await backend.aclose()
        assert "sandboxclaims" not in _kinds(cluster) and "pods" not in _kinds(cluster)


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_without_the_controller_the_claim_times_out_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No controller binds the claim (the warm pool is missing here): a clear error at the timeout."""
    config = _config(tmp_path, timeout_s=1)
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    async with FakeCluster(namespaces={namespace}) as cluster:
        original = cluster.add

        async def no_pool(kind: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
            if kind == "sandboxwarmpools":
                return obj  # never stored: the fake controller then binds nothing
            return await original(kind, ns, obj)

        monkeypatch.setattr(cluster, "add", no_pool)
        backend = KubernetesBackend(config, api=cluster.api())
        spec = spec_from_config(config, effective_agent(config, "main"), "agent:main:y", config.instance or "")
        try:
            with pytest.raises(SandboxUnavailable, match="agent-sandbox controller"):
                await backend.ensure(spec)
        finally:
            await backend.aclose()
