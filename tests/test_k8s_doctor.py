"""`sandbox doctor` on Kubernetes, against the fake API (no Pods are made: no engine needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.config import load_config_text
from sandbox.config.kubernetes import KubernetesSection
from sandbox.runtime.kubernetes import api as k8s_api
from sandbox.runtime.kubernetes.doctor import run_checks
from sandbox.runtime.kubernetes.names import namespace_for
from tests.cli_helpers import run_cli
from tests.k8s_fake_cluster import FakeCluster

pytestmark = pytest.mark.anyio

NS = namespace_for(KubernetesSection(), "acme")  # sbx-acme-<hash>


def _config(tmp_path: Path, kubernetes: str = "") -> object:
    return load_config_text(
        f"state_dir: {tmp_path / 'state'}\nruntime:\n  backend: kubernetes\n  kubernetes: {{{kubernetes}}}\n"
        "tenants: [{id: acme}]\nagents: {list: [{id: main, tenant: acme}]}\n",
        base_dir=tmp_path,
    )


def _api(cluster: FakeCluster, token: str | None = None) -> k8s_api.Api:
    api: k8s_api.Api = cluster.api(token)
    return api


@pytest.mark.slow
async def test_a_ready_cluster_passes_and_the_pid_limit_is_said(tmp_path: Path) -> None:
    config = _config(tmp_path, "runtime_class_name: gvisor, storage_class: standard")
    async with FakeCluster(namespaces={NS}, runtime_classes={"gvisor"}, storage_classes={"standard"}) as cluster:
        api = _api(cluster)
        checks = {c.name: c for c in await run_checks(config, api)}  # type: ignore[arg-type]
        await api.close()
    assert [checks[n].status for n in ("api", "namespace", "can-i", "runtime class", "storage class")] == ["ok"] * 5
    assert checks["pid limit"].status == "warn" and "podPidsLimit" in checks["pid limit"].fix


@pytest.mark.slow
async def test_each_missing_piece_is_a_failure_with_its_fix(tmp_path: Path) -> None:
    config = _config(tmp_path, "runtime_class_name: kata")
    async with FakeCluster(
        namespaces={NS},
        namespace_labels={NS: {"pod-security.kubernetes.io/enforce": "baseline"}},
        denied={("create", "pods", "exec")},
    ) as cluster:
        api = _api(cluster)
        checks = {c.name: c for c in await run_checks(config, api)}  # type: ignore[arg-type]
        await api.close()
    assert checks["namespace"].status == "fail" and "baseline" in checks["namespace"].detail
    assert checks["can-i"].status == "fail" and "create pods/exec" in checks["can-i"].detail
    assert "k8s render" in checks["can-i"].fix
    assert checks["runtime class"].status == "fail" and "kata" in checks["runtime class"].detail


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_missing_namespace_is_named(tmp_path: Path) -> None:
    async with FakeCluster() as cluster:
        api = _api(cluster)
        checks = {c.name: c for c in await run_checks(_config(tmp_path), api)}  # type: ignore[arg-type]
        await api.close()
    assert checks["namespace"].status == "fail" and f"{NS} does not exist" in checks["namespace"].detail


def test_the_cli_reports_an_unusable_kubeconfig_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\nruntime:\n  backend: kubernetes\n"
        f"  kubernetes: {{kubeconfig: {tmp_path / 'missing-kubeconfig'}}}\n"
    )
    done = run_cli("doctor", config=path)
    assert done.returncode == 1, done.stderr
    assert "[FAIL] api" in done.stdout and "Traceback" not in done.stdout + done.stderr
