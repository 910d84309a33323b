"""The measured workspace quota and the tenant's quota around it (pure filesystem, no engine)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sandbox.config import load_config_text
from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs import quota as quota_module
from sandbox.fs.quota import WorkspaceQuota
from sandbox.runtime.naming import tenant_dir_name
from sandbox.runtime.spec import scratch_workspace, tenant_workspaces

MIB = 2**20


def fill(folder: Path, name: str, size: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"x" * size)


def quotas(tmp_path: Path, own: int, tenant: int) -> tuple[WorkspaceQuota, Path, Path]:
    mine, sibling = tmp_path / "t" / "mine", tmp_path / "t" / "sibling"
    mine.mkdir(parents=True)
    sibling.mkdir(parents=True)
    outer = WorkspaceQuota([tmp_path / "t"], tenant, "tenants[0].quotas.max_workspace_bytes", label="the tenant")
    return WorkspaceQuota([mine], own, "sandbox.workspace_quota", outer=outer), mine, sibling


def test_a_write_must_fit_the_workspace_and_the_tenant(tmp_path: Path) -> None:
    quota, _mine, sibling = quotas(tmp_path, own=8 * MIB, tenant=10 * MIB)
    fill(sibling, "big", 6 * MIB)  # another session of the tenant
    quota.check_write(3 * MIB, 0, "a")  # 6 + 3 fits both
    with pytest.raises(SandboxError) as refused:
        quota.check_write(5 * MIB, 0, "b")  # fits the workspace (8), not the tenant (6 + 5 > 10)
    assert refused.value.code == ErrorCode.QUOTA_EXCEEDED
    assert "tenants[0].quotas.max_workspace_bytes" in refused.value.message and "the tenant" in refused.value.message
    with pytest.raises(SandboxError) as own:
        quota.check_write(9 * MIB, 0, "c")  # past the workspace's own first
    assert "sandbox.workspace_quota" in own.value.message
    quota.check_write(1 * MIB, 4 * MIB, "shrink")  # shrinking is never refused


def test_a_refusal_comes_from_a_measurement_never_from_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes charge the cached measurement; when the estimate says "over", the disk is walked
    again, and only a real overrun refuses."""
    quota, mine, _ = quotas(tmp_path, own=0, tenant=10 * MIB)
    assert quota.enabled and [q.key for q in quota.levels] == ["tenants[0].quotas.max_workspace_bytes"]
    for i in range(3):
        quota.check_write(3 * MIB, 0, f"f{i}")  # charged, but never written
    quota.check_write(3 * MIB, 0, "f3")  # the estimate (12) is over; the disk (0) is not
    fill(mine, "real", 9 * MIB)  # a command wrote it: seen at the next measurement
    monkeypatch.setattr("sandbox.fs.quota.CACHE_S", 0.0)
    with pytest.raises(SandboxError):
        quota.check_write(3 * MIB, 0, "f4")


def test_breached_names_the_level_a_running_command_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sandbox.fs.quota.CACHE_S", 0.0)  # outer levels are read through the cache
    quota, mine, _sibling = quotas(tmp_path, own=50 * MIB, tenant=10 * MIB)
    start = quota.measure()
    assert quota.breached(start) is None
    fill(mine, "grow", 12 * MIB)
    breach = quota.breached(start)
    assert breach is not None and breach[0].key == "tenants[0].quotas.max_workspace_bytes" and breach[1] >= 12 * MIB


def test_a_neighbours_bytes_never_stop_a_command_that_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session takes the tenant past its limit while this command runs: this command
    wrote nothing in its workspace, so it is not the one stopped."""
    monkeypatch.setattr("sandbox.fs.quota.CACHE_S", 0.0)
    quota, mine, sibling = quotas(tmp_path, own=0, tenant=4 * MIB)
    start = quota.measure()
    fill(sibling, "big", 8 * MIB)
    assert quota.breached(start) is None
    fill(mine, "mine", 1 * MIB)  # now it grows: the tenant is over, and this command is stopped
    breach = quota.breached(start)
    assert breach is not None and breach[0].key == "tenants[0].quotas.max_workspace_bytes"


def test_concurrent_measurements_share_one_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads asking at once for a fresh measurement of the same folders walk them once."""
    import threading

    from sandbox.fs import quota as quota_module

    walks = []
    real = quota_module.disk_usage

    def counted(root: Path) -> int:
        walks.append(root)
        threading.Event().wait(0.2)  # a slow walk, so the others arrive while it runs
        return real(root)

    monkeypatch.setattr(quota_module, "disk_usage", counted)
    quota, _, _ = quotas(tmp_path, own=0, tenant=4 * MIB)
    assert quota.outer is not None
    outer = quota.outer
    threads = [threading.Thread(target=outer.used, kwargs={"fresh": True}) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= len(walks) <= 2, walks  # one walk, or two when a thread asked after the first began


def test_a_command_that_did_not_grow_is_not_stopped(tmp_path: Path) -> None:
    """A tenant already over its limit (a sibling filled it) does not kill a command that writes nothing."""
    quota, _, sibling = quotas(tmp_path, own=0, tenant=1 * MIB)
    fill(sibling, "big", 3 * MIB)
    start = quota.measure()
    assert quota.breached(start) is None


def test_tenant_workspaces_are_the_rw_workspaces_and_scratch_folders_of_its_agents(tmp_path: Path) -> None:
    config = load_config_text(
        f"""
state_dir: {tmp_path / "state"}
tenants: [{{id: acme}}, {{id: globex}}]
agents:
  defaults: {{sandbox: {{mode: all}}}}
  list:
    - {{id: a1, tenant: acme, workspace: {tmp_path / "w1"}, sandbox: {{workspace_access: rw}}}}
    - {{id: a2, tenant: acme, workspace: {tmp_path / "w2"}, sandbox: {{workspace_access: ro}}}}
    - {{id: a3, tenant: acme}}
    - {{id: a4, tenant: acme, sandbox: {{mode: "off", workspace_access: rw}}, workspace: {tmp_path / "w4"}}}
    - {{id: g1, tenant: globex, workspace: {tmp_path / "w5"}, sandbox: {{workspace_access: rw}}}}
""",
        source="t.yaml",
        base_dir=tmp_path,
    )
    scratch_root = (tmp_path / "state" / "sandboxes").resolve()
    assert tenant_workspaces(config, "acme") == sorted(
        [(tmp_path / "w1").resolve(), scratch_root / tenant_dir_name("acme")]
    )
    assert tenant_workspaces(config, "globex") == [(tmp_path / "w5").resolve()]
    from sandbox.config.merge import effective_agent

    # a scratch workspace lies in its tenant's folder, so the tenant's walk finds it
    assert scratch_workspace(effective_agent(config, "a3"), "s").parent == scratch_root / tenant_dir_name("acme")


def test_a_scratch_workspace_made_before_tenant_folders_moves_in_with_its_files(tmp_path: Path) -> None:
    from sandbox.runtime.folders import _prepare_scratch

    root = tmp_path / "sandboxes"
    name = "ab" * 16
    (root / name).mkdir(parents=True)
    (root / name / "notes.txt").write_text("kept")
    workspace = root / tenant_dir_name("acme") / name
    _prepare_scratch(workspace, None, None)
    assert (workspace / "notes.txt").read_text() == "kept" and not (root / name).exists()


def test_a_link_at_the_old_scratch_place_is_never_moved(tmp_path: Path) -> None:
    from sandbox.runtime.folders import _prepare_scratch

    root = tmp_path / "sandboxes"
    root.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "secret").write_text("s")
    name = "cd" * 16
    (root / name).symlink_to(target)
    workspace = root / tenant_dir_name("acme") / name
    _prepare_scratch(workspace, None, None)
    assert workspace.is_dir() and not workspace.is_symlink() and list(workspace.iterdir()) == []
    assert (root / name).is_symlink() and (target / "secret").exists()


def test_an_old_scratch_workspace_never_overwrites_a_new_one(tmp_path: Path) -> None:
    """Both places hold files (two orchestrator versions on one root): nothing is merged or lost."""
    from sandbox.runtime.folders import _prepare_scratch

    root = tmp_path / "sandboxes"
    name = "ef" * 16
    workspace = root / tenant_dir_name("acme") / name
    (root / name).mkdir(parents=True)
    (root / name / "old.txt").write_text("old")
    workspace.mkdir(parents=True)
    (workspace / "new.txt").write_text("new")
    _prepare_scratch(workspace, None, None)
    assert (workspace / "new.txt").read_text() == "new" and not (workspace / "old.txt").exists()
    assert (root / name / "old.txt").read_text() == "old"


def test_a_small_workspace_is_measured_on_the_callers_thread_as_a_full_walk_would(tmp_path: Path) -> None:
    """exec measures before each command: a few files are walked at once (no thread hop), and
    give what the full measurement gives."""
    quota, mine, _ = quotas(tmp_path, 10 * MIB, 100 * MIB)
    fill(mine, "a.bin", 64 * 1024)
    fill(mine / "sub", "b.bin", 8 * 1024)
    assert quota.outer is not None
    quota.outer.used(fresh=True)  # the tenant's measurement is fresh
    small = quota.measure_small()
    assert small is not None and small == quota.measure()


def test_a_workspace_too_big_to_walk_at_once_is_left_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More than SMALL_WALK entries, a folder whose listing is large (one that held many files
    keeps its size on ext4), or a stale measurement of the tenant: None, and exec measures in a
    worker thread instead, never blocking the event loop for a hostile workspace's shape."""
    quota, mine, _ = quotas(tmp_path, 10 * MIB, 100 * MIB)
    assert quota.outer is not None
    quota.outer.used(fresh=True)
    for i in range(quota_module.SMALL_WALK + 1):
        fill(mine, f"f{i}", 1)
    assert quota.measure_small() is None
    for i in range(quota_module.SMALL_WALK + 1):
        (mine / f"f{i}").unlink()
    assert quota.measure_small() is not None
    monkeypatch.setattr(quota_module, "SMALL_DIR_BYTES", 0)  # any folder's listing is "large"
    assert quota.measure_small() is None
    monkeypatch.undo()
    monkeypatch.setattr(quota_module, "CACHE_S", 0.0)  # the tenant's measurement is stale
    assert quota.measure_small() is None


def test_a_month_of_sessions_is_not_remembered_forever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One measurement (and walk lock) per workspace ever measured would grow without end over a
    month of sessions: past KEPT root sets, the stale ones are forgotten; fresh ones stay."""
    monkeypatch.setattr(quota_module, "KEPT", 50)
    monkeypatch.setattr(WorkspaceQuota, "_cache", {})
    monkeypatch.setattr(WorkspaceQuota, "_walks", {})
    clock = [1000.0]
    monkeypatch.setattr(quota_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    for i in range(500):
        WorkspaceQuota([tmp_path / f"session-{i}"], MIB).used()
        clock[0] += 1.0  # each measured a second after the last: older than CACHE_S soon
    assert len(WorkspaceQuota._cache) <= 51 and len(WorkspaceQuota._walks) <= 51
    fresh = WorkspaceQuota([tmp_path / "now"], MIB)
    fresh.used()
    clock[0] += 0.5
    for i in range(60):  # forgetting rounds (past KEPT) while it is still fresh
        WorkspaceQuota([tmp_path / f"burst-{i}"], MIB).used()
    assert fresh.cached()
    assert len(WorkspaceQuota._cache) > 50  # what is fresh is kept, however many
