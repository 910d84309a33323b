"""The fixture the cluster-only checks share (tests/contract/test_cluster_*.py): the tenant `acme`
applied to the cluster, its namespace and the objects the operator applies (once per test module;
applying them again changes nothing). Only those checks ask for it, and they are skipped without a
cluster, so it never runs here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.config import load_config_text
from sandbox.runtime.kubernetes.tenant import Orchestrator, tenant_objects
from tests.contract.cluster import kubectl


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    config = load_config_text(
        f"state_dir: {tmp / 'state'}\ninstance: e2e\n"
        "runtime: {backend: kubernetes, kubernetes: {seccomp: 'Localhost:agent-sandbox/strict.json'}}\n"
        "tenants: [{id: acme}]\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_access: none}}, "
        f"list: [{{id: main, tenant: acme, workspace: {tmp / 'ws'}}}]}}\n",
        base_dir=tmp,
    )
    objects = tenant_objects(config, config.tenants[0], Orchestrator())
    applied = kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    assert applied.returncode == 0, applied.stderr
    return config
