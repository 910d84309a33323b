"""Long outputs spend the host's disk for a tenant only within its quota, and a result never hands
a tenant a host path (issue 24, item 7): a flood of long outputs under a 40 MB
`max_workspace_bytes` leaves nothing of the tenant's outside its workspaces, captures in flight
stay within the quota, and `full_output_path` is a workspace-relative path the tenant can read, or
null with a note where no copy can be kept (a read-only workspace)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.fs.quota import disk_usage

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

QUOTA = 40 * 1024 * 1024
QUOTA_TEXT = "40m"
MB15 = "head -c 15000000 /dev/zero | tr '\\0' x"
MB30 = "head -c 30000000 /dev/zero | tr '\\0' y"


def held_outside_workspaces(state_dir: Path) -> int:
    """Bytes of output files under the state dir (exec's captures, or old-style spills)."""
    total = 0
    for path in [*(state_dir / "outputs").rglob("*.txt"), *state_dir.rglob("spilled/*")]:
        try:  # a capture removed between the listing and its stat (a call ending): it holds nothing
            total += path.stat().st_size if path.is_file() else 0
        except FileNotFoundError:
            continue
    return total


def no_host_path(path: str | None, state_dir: Path) -> bool:
    return path is None or (not os.path.isabs(path) and str(state_dir) not in path)


async def test_a_flood_of_long_outputs_stays_within_the_tenant_quota(make_config: Any, tmp_path: Path) -> None:
    """12 outputs of 15 MB (180 MB) under a 40 MB tenant quota: the copies kept are in the workspace
    (within the quota, readable by the tenant at the relative path given), nothing stays in the
    state dir, and every result names no host path."""
    config = make_config(
        f"""
tenants: [{{id: acme, quotas: {{max_workspace_bytes: {QUOTA_TEXT}}}}}]
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list: [{{id: coder, tenant: acme}}]
"""
    )
    state_dir: Path = config.state_dir
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:coder:flood")
        results = [await sess.call("exec", {"command": MB15}) for _ in range(12)]
        for r in results:
            assert r.ok and r.truncated, r
            assert no_host_path(r.full_output_path, state_dir), r.full_output_path
            assert str(state_dir) not in str(r.output) and str(tmp_path) not in str(r.output), r.output
        kept = [r for r in results if r.full_output_path]
        assert kept, "the first outputs fit the quota and are kept"
        assert len(kept) < len(results), "not all 180 MB can be kept under 40 MB"
        dropped = next(r for r in results if not r.full_output_path)
        assert "not saved" in dropped.output["note"] or "not be saved" in dropped.output["note"], dropped.output
        # the tenant reads a kept copy back at the path it was given
        path = kept[0].full_output_path
        assert path == f".sandbox/outputs/{kept[0].call_id}.txt"
        size = await sess.call("exec", {"command": f"wc -c < {path}"})
        assert size.ok and size.output["output"].strip() == "15000000", size
        spec = orch.manager.spec_for(sess.agent, "agent:coder:flood")
        workspace = disk_usage(Path(spec.workspace.source))
        outside = held_outside_workspaces(state_dir)
    print(
        f"flood: printed {12 * 15_000_000:,} bytes in 12 calls under a {QUOTA:,}-byte quota; "
        f"kept {len(kept)} copies, workspace {workspace:,} bytes, captures/spills left in the state dir {outside:,} bytes"
    )
    assert outside == 0
    assert workspace <= QUOTA


async def test_long_outputs_in_flight_are_bounded_by_the_tenant_quota(make_config: Any) -> None:
    """Four calls at once, each printing 30 MB under a 40 MB tenant quota: the tenant's captures
    on the host never hold more than the quota at any moment, and none is left afterwards."""
    config = make_config(
        f"""
tenants: [{{id: acme, quotas: {{max_workspace_bytes: {QUOTA_TEXT}}}}}]
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list: [{{id: coder, tenant: acme}}]
"""
    )
    state_dir: Path = config.state_dir
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, held_outside_workspaces(state_dir))
            stop.wait(0.02)

    async with Orchestrator(config) as orch:
        sessions = [orch.session(f"agent:coder:in-flight-{i}") for i in range(4)]
        for s in sessions:  # sandboxes first: the burst is of outputs, not of container starts
            assert (await s.call("exec", {"command": "true"})).ok
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        results: list[Any] = []
        try:
            async with anyio.create_task_group() as tg:
                for s in sessions:

                    async def one(s: Any = s) -> None:
                        results.append(await s.call("exec", {"command": MB30}))

                    tg.start_soon(one)
        finally:
            stop.set()
            watcher.join(timeout=5)
    print(
        f"in flight: 4 x 30,000,000 bytes printed at once; peak captured on the host {peak:,} bytes (quota {QUOTA:,})"
    )
    assert all(r.ok and r.truncated for r in results), results
    assert all(no_host_path(r.full_output_path, state_dir) for r in results)
    assert peak <= QUOTA
    assert held_outside_workspaces(state_dir) == 0


async def test_a_read_only_workspace_keeps_no_full_output_and_names_no_host_path(
    make_config: Any, tmp_path: Path
) -> None:
    """A read-only workspace: the long output is cut with a note saying why no copy is kept;
    nothing of it is left on the host, and no host path is handed out."""
    ws = tmp_path / "ro-ws"
    ws.mkdir()
    config = make_config(
        f"""
tenants: [{{id: acme}}]
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list: [{{id: reader, tenant: acme, workspace: "{ws}", sandbox: {{workspace_access: ro}}}}]
"""
    )
    state_dir: Path = config.state_dir
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:reader:s")
        long = await sess.call("exec", {"command": "head -c 3000000 /dev/zero | tr '\\0' x"})
        # an output cut by the engine (longer than results.max_chars, short enough to be held in
        # memory) follows the same rule
        listing = await sess.call("exec", {"command": "seq 1 20000"})
    assert long.ok and long.truncated and long.full_output_path is None, long
    assert "read-only" in long.output["note"], long.output
    assert listing.ok and listing.truncated and listing.full_output_path is None, listing
    assert any("read-only" in w for w in listing.warnings), listing.warnings
    assert str(state_dir) not in str(long.output) and str(state_dir) not in str(long.warnings)
    assert held_outside_workspaces(state_dir) == 0
    assert list(ws.iterdir()) == []
