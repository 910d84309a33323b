"""`sandbox explain` on a cluster reads what is live: the API server's version (what subprotocol
it answers), the session's Pod, and the subprotocol its agent's link agreed, which the backend
notes on the Pod when a link opens. Against the fake API (its kubeconfig, as a user's), v5 and
v4-only; and without a cluster, a line saying why it was not asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
import yaml
from click.testing import CliRunner

from sandbox.cli import main as cli_main
from sandbox.config.models import Config
from sandbox.engine.orchestrator import Orchestrator
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.exec_ws import V4, V5
from sandbox.runtime.kubernetes.names import K8sAnnotations, namespace_for
from tests.conftest import RUN_ID, TEST_LABEL
from tests.k8s_fake_cluster import FakeCluster
from tests.k8s_helpers import one_agent_config

pytestmark = pytest.mark.anyio
SANDBOX = "{mode: all, scope: session, workspace_access: none}"


def _config_file(tmp_path: Path, config: Config) -> Path:
    path = tmp_path / "sandbox.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


async def _explain(path: Path, session: str) -> str:
    done = await anyio.to_thread.run_sync(
        lambda: CliRunner().invoke(cli_main, ["--config", str(path), "explain", "--session", session])
    )
    assert done.exit_code == 0, done.output
    return str(done.output)


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_before_any_pod_explain_says_which_subprotocol_the_server_answers(tmp_path: Path) -> None:
    async with FakeCluster() as cluster:
        config = one_agent_config(tmp_path, "live1", SANDBOX, f"kubeconfig: {cluster.kubeconfig(tmp_path / 'kc')}")
        cluster.namespaces.add(namespace_for(config.runtime.kubernetes, "acme"))
        out = await _explain(_config_file(tmp_path, config), "agent:main:l1")
    assert "live       API server v1.33.0-fake; Pod none yet" in out
    assert f"no link yet; {V5} expected" in out


async def test_without_a_cluster_explain_says_why_it_was_not_asked(tmp_path: Path) -> None:
    config = one_agent_config(tmp_path, "live2", SANDBOX, f"kubeconfig: {tmp_path / 'no-such-kubeconfig'}")
    out = await _explain(_config_file(tmp_path, config), "agent:main:l2")
    assert "live       the cluster was not asked: runtime.kubernetes: kubeconfig" in out
    assert "pod        sbx-acme-" in out  # the rest of the Pod is still shown, from the config


@pytest.mark.docker
@pytest.mark.parametrize("protocols", [(V5, V4), (V4,)], ids=["v5", "v4-only"])
async def test_a_live_links_agreed_subprotocol_is_noted_on_its_pod_and_explained(
    tmp_path: Path, docker_client: Any, images: None, protocols: tuple[str, ...]
) -> None:
    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, RUN_ID), protocols=protocols) as cluster:
        kubeconfig = cluster.kubeconfig(tmp_path / "kc")
        config = one_agent_config(tmp_path, f"{RUN_ID}x", SANDBOX, f"kubeconfig: {kubeconfig}")
        namespace = namespace_for(config.runtime.kubernetes, "acme")
        cluster.namespaces.add(namespace)
        async with Orchestrator(config, KubernetesBackend(config, api=cluster.api()), journal=False) as orch:
            session = orch.session(agent="main", key="agent:main:l3")
            ran = await session.call("exec", {"command": "true"})
            assert ran.ok, ran.error
            ((_, _, pod_name),) = [k for k in cluster.objects if k[0] == "pods"]
            pod = cluster.objects[("pods", namespace, pod_name)]
            assert pod["metadata"]["annotations"][K8sAnnotations.EXEC_PROTOCOL] == protocols[0]
            out = await _explain(_config_file(tmp_path, config), session.key)
            await session.close()
    assert f"Pod Running; its link agreed {protocols[0]}" in out
    assert ("v4: the stream ends only with its socket" in out) == (protocols[0] == V4)
