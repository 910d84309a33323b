"""The Kubernetes backend end to end against a fake API whose Pods are real containers
(tests/k8s_fake_cluster.py): the tools, through the orchestrator, in a restricted Pod made from
the rendered manifest, every command and file through the agent over `pods/exec`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.config import load_config_text
from sandbox.engine.orchestrator import Orchestrator
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import namespace_for
from tests.conftest import RUN_ID, TEST_LABEL
from tests.k8s_fake_cluster import FakeCluster

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def k8s_config(tmp_path: Path, extra: str = "") -> Any:
    return load_config_text(
        f"""
state_dir: {tmp_path / "state"}
instance: {RUN_ID}k
runtime:
  backend: kubernetes
  kubernetes: {{pod_ready_timeout_s: 60, exec_heartbeat_s: 20, seccomp: "Localhost:agent-sandbox/strict.json"}}
tenants:
  - id: acme
agents:
  defaults:
    workspace: {tmp_path / "ws"}
    sandbox: {{mode: all, scope: session, workspace_access: none}}
  list:
    - {{id: main, tenant: acme, default: true}}
{extra}
""",
        base_dir=tmp_path,
    )


@pytest.fixture
async def cluster(docker_client: Any, images: None) -> AsyncIterator[FakeCluster]:
    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, RUN_ID)) as fake:
        yield fake


def backend_on(cluster: FakeCluster, config: Any, token: str | None = None) -> KubernetesBackend:
    cluster.namespaces.add(namespace_for(config.runtime.kubernetes, "acme"))
    return KubernetesBackend(config, api=cluster.api(token))


async def test_tools_run_in_a_restricted_pod_through_the_agent(tmp_path: Path, cluster: FakeCluster) -> None:
    config = k8s_config(tmp_path)
    backend = backend_on(cluster, config)
    async with Orchestrator(config, backend, journal=False) as orch:
        session = orch.session(agent="main", key="agent:main:k1")
        ran = await session.call("exec", {"command": "id -u; echo hi > note.txt"})
        assert ran.ok, ran.error
        out = ran.output["output"] if isinstance(ran.output, dict) else str(ran.output)
        assert "1000" in out
        # the file tools reach the Pod's workspace through the agent, not a host folder
        read = await session.call("read", {"path": "note.txt"})
        assert read.ok and "hi" in str(read.output), read.error
        wrote = await session.call("write", {"path": "made.txt", "content": "from the file tool\n"})
        assert wrote.ok, wrote.error
        seen = await session.call("exec", {"command": "cat made.txt"})
        assert "from the file tool" in str(seen.output)
        pods = [k for k in cluster.objects if k[0] == "pods"]
        assert len(pods) == 1
        assert len(backend._heartbeats) == 1  # its agent link is pinged (the kubelet cuts idle streams)
        listed = await orch.backend.list(instance=config.instance)
        assert [i.name for i in listed] == [pods[0][2]] and listed[0].tenant == "acme"
        await session.close()
    assert [k for k in cluster.objects if k[0] == "pods"] == []  # the session's Pod went with it


async def test_a_timeout_kills_the_command_in_the_pod(tmp_path: Path, cluster: FakeCluster) -> None:
    config = k8s_config(tmp_path)
    async with Orchestrator(config, backend_on(cluster, config), journal=False) as orch:
        session = orch.session(agent="main", key="agent:main:k2")
        slow = await session.call("exec", {"command": "sleep 300 & sleep 300", "timeout_s": 1})
        assert not slow.ok and slow.error.code == "TIMEOUT"
        left = await session.call("exec", {"command": "ps -eo args | grep -c '^sleep 300' || true"})
        assert left.output["output"].strip() == "0", left.output  # nothing of the call is left
        await session.close()


async def test_a_pod_that_cannot_start_is_a_clear_error(tmp_path: Path, cluster: FakeCluster) -> None:
    extra = f"    - {{id: broken, tenant: acme, workspace: {tmp_path / 'ws2'}, sandbox: {{docker: {{image: 'sandbox-missing:none'}}}}}}"
    config = k8s_config(tmp_path, extra)
    async with Orchestrator(config, backend_on(cluster, config), journal=False) as orch:
        session = orch.session(agent="broken", key="agent:broken:k3")
        ran = await session.call("exec", {"command": "true"})
        assert not ran.ok and ran.error.code == "SANDBOX_UNAVAILABLE"
        assert "ErrImageNeverPull" in ran.error.message or "did not start" in ran.error.message
    assert [k for k in cluster.objects if k[0] == "pods"] == []  # not left half made


async def test_without_the_role_the_error_says_what_to_apply(tmp_path: Path, cluster: FakeCluster) -> None:
    config = k8s_config(tmp_path)
    async with Orchestrator(config, backend_on(cluster, config, token="not-bound"), journal=False) as orch:
        ran = await orch.session(agent="main", key="agent:main:k4").call("exec", {"command": "true"})
        assert not ran.ok and ran.error.code == "SANDBOX_UNAVAILABLE"
        assert "403" in ran.error.message and "k8s render" in ran.error.message


async def test_a_planted_pod_under_the_name_is_not_adopted(tmp_path: Path, cluster: FakeCluster) -> None:
    """A Pod someone else made under the sandbox's name (loose RBAC, another controller) with a
    weaker spec is replaced, never handed the session's commands."""
    from sandbox.config import effective_agent
    from sandbox.runtime.kubernetes.pod import sandbox_pod
    from sandbox.runtime.spec import spec_from_config

    config = k8s_config(tmp_path)
    backend = backend_on(cluster, config)
    spec = spec_from_config(config, effective_agent(config, "main"), "agent:main:k5", str(config.instance))
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    planted = sandbox_pod(spec, config.runtime.kubernetes, namespace)
    planted["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    api = await backend.api()
    await api.create("pods", namespace, planted)
    try:
        box = await backend.ensure(spec)
        deletes = [path for method, path in cluster.requests if method == "DELETE"]
        assert deletes == [f"/api/v1/namespaces/{namespace}/pods/{spec.name}"]  # replaced, not adopted
        live = cluster.objects[("pods", namespace, spec.name)]
        assert live["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        same = await backend.ensure(spec)  # its own Pod is adopted
        assert same.id == box.id and len([m for m, _ in cluster.requests if m == "DELETE"]) == 1
        await backend.remove(box.id)
    finally:
        await backend.aclose()


async def test_a_used_up_quota_is_a_quota_error(tmp_path: Path, cluster: FakeCluster) -> None:
    cluster.max_pods = 1
    config = k8s_config(tmp_path)
    async with Orchestrator(config, backend_on(cluster, config), journal=False) as orch:
        first = await orch.session(agent="main", key="agent:main:q1").call("exec", {"command": "true"})
        assert first.ok, first.error
        second = await orch.session(agent="main", key="agent:main:q2").call("exec", {"command": "true"})
        assert not second.ok and second.error.code == "QUOTA_EXCEEDED", second.error
        assert "ResourceQuota" in second.error.message


async def test_the_setup_command_runs_before_the_sandbox_serves(tmp_path: Path, cluster: FakeCluster) -> None:
    """What `setup_command` writes to the workspace and to a tmpfs (an emptyDir) is there for the
    first call; a setup that fails is the error, with its output, and leaves no Pod."""
    setup = "echo ready > /workspace/setup.txt && echo cached > /tmp/cache.txt && id -u > /tmp/who"
    extra = (
        f"    - {{id: prepared, tenant: acme, workspace: {tmp_path / 'ws3'}, "
        f"sandbox: {{docker: {{setup_command: '{setup}'}}}}}}\n"
        f"    - {{id: failing, tenant: acme, workspace: {tmp_path / 'ws4'}, "
        "sandbox: {docker: {setup_command: 'echo no such mirror >&2; exit 3'}}}"
    )
    config = k8s_config(tmp_path, extra)
    async with Orchestrator(config, backend_on(cluster, config), journal=False) as orch:
        ran = await orch.session(agent="prepared", key="agent:prepared:k6").call(
            "exec", {"command": "cat /workspace/setup.txt /tmp/cache.txt /tmp/who"}
        )
        assert ran.ok, ran.error
        assert ran.output["output"].split() == ["ready", "cached", "1000"]
        failed = await orch.session(agent="failing", key="agent:failing:k7").call("exec", {"command": "true"})
        assert not failed.ok and failed.error.code == "SANDBOX_UNAVAILABLE"
        assert "no such mirror" in failed.error.message and "setup" in failed.error.message
        names = [k[2] for k in cluster.objects if k[0] == "pods"]
        assert len(names) == 1  # the prepared session's; the failed one is not left half made
