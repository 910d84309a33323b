"""Issue 24, item 7 through the real service: a tenant floods long outputs over HTTP under a 40 MB
`max_workspace_bytes`; no response names a host path (the state dir, the workspace's host folder),
and nothing of the tenant's outputs stays on the host outside its workspace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.fs.quota import disk_usage
from sandbox.runtime.spec import tenant_workspaces
from tests.service_helpers import TOKEN_A, serve, sha

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

A = {"Authorization": f"Bearer {TOKEN_A}"}
QUOTA = 40 * 1024 * 1024


def test_a_tenants_flood_of_long_outputs_over_http(make_config: Any, tmp_path: Path) -> None:
    """12 calls printing 15 MB each (180 MB) under a 40 MB quota: every answer is a cut output with
    a workspace-relative `full_output_path` or null, never a host path; afterwards the state dir
    holds no output of the tenant's and its workspaces hold at most the quota."""
    config = make_config(f"""
tenants:
  - {{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}], quotas: {{max_workspace_bytes: 40m}}}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
    - {{id: alpha, tenant: acme, default: true}}
""")
    state_dir: Path = config.state_dir
    bodies: list[dict[str, Any]] = []
    with serve(config) as url:
        for _ in range(12):
            r = httpx.post(
                f"{url}/v1/sessions/flood/calls",
                headers=A,
                json={"tool": "exec", "args": {"command": "head -c 15000000 /dev/zero | tr '\\0' x"}},
                timeout=180,
            )
            assert r.status_code == 200, r.text
            assert str(state_dir) not in r.text and str(tmp_path) not in r.text, r.text[:2000]
            bodies.append(r.json())
        httpx.delete(f"{url}/v1/sessions/flood", headers=A, timeout=120)
    paths = [b["full_output_path"] for b in bodies]
    assert all(b["ok"] and b["truncated"] for b in bodies), [json.dumps(b)[:300] for b in bodies]
    assert all(p is None or (p.startswith(".sandbox/outputs/") and ".." not in p) for p in paths), paths
    assert any(p is not None for p in paths) and any(p is None for p in paths), paths
    left = [*(state_dir / "outputs").rglob("*.txt"), *state_dir.rglob("spilled/*")]
    held = sum(f.stat().st_size for f in left if f.is_file())
    workspaces = sum(disk_usage(p) for p in tenant_workspaces(config, "acme"))
    print(
        f"service flood: 180,000,000 bytes printed over HTTP under a {QUOTA:,}-byte quota; "
        f"{sum(p is not None for p in paths)} copies kept; the tenant's workspaces hold {workspaces:,} bytes; "
        f"outputs left in the state dir outside them: {held:,} bytes"
    )
    assert held == 0
    assert workspaces <= QUOTA
