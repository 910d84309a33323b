"""A read-write workspace the sandbox user cannot write: explain, doctor and audit say so and how to fix it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandbox.audit.ownership import write_problem
from sandbox.config import load_config
from sandbox.runtime.docker.doctor import workspace_checks
from tests.cli_helpers import run_cli

OTHER = "4242:4242"  # a sandbox user that owns nothing here, whoever runs the tests
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="makes files owned by root and chowns them")


def _config(tmp_path: Path, user: str | None = OTHER, access: str = "rw") -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(mode=0o755, exist_ok=True)
    ws.chmod(0o755)  # whatever the umask: writable by its owner only
    docker = f", docker: {{user: '{user}'}}" if user else ""
    path = tmp_path / "config.yaml"
    path.write_text(
        f"state_dir: {tmp_path}/state\n"
        f"agents: {{defaults: {{workspace: {ws}, sandbox: {{mode: all, workspace_access: {access}{docker}}}}}}}\n"
    )
    return path


def test_write_problem_follows_owner_then_group_then_others(tmp_path: Path) -> None:
    """Owner bits decide for the owner, group bits for the group, others' bits for everyone else."""
    me = f"{os.geteuid()}:{os.getegid()}"
    tmp_path.chmod(0o755)
    assert write_problem(str(tmp_path), me) is None
    assert write_problem(str(tmp_path), OTHER) is not None
    tmp_path.chmod(0o555)
    assert write_problem(str(tmp_path), me) is not None  # the owner without w
    tmp_path.chmod(0o775)
    assert write_problem(str(tmp_path), f"4242:{os.getegid()}") is None  # the group with w
    tmp_path.chmod(0o777)
    assert write_problem(str(tmp_path), OTHER) is None
    tmp_path.chmod(0o755)


def test_write_problem_cannot_tell_for_names_or_missing_paths(tmp_path: Path) -> None:
    """A user name (ids live in the image) or a workspace not made yet is not judged."""
    tmp_path.chmod(0o755)
    assert write_problem(str(tmp_path), "sandbox") is None
    assert write_problem(str(tmp_path / "not-yet"), OTHER) is None


def test_explain_warns_with_the_fix(tmp_path: Path) -> None:
    """explain lists the unwritable rw workspace in --json and prints a WARNING and the fix."""
    config = _config(tmp_path)
    data = json.loads(run_cli("explain", "--session", "agent:main:x", "--json", config=config).stdout)
    [unwritable] = data["container"]["unwritable"]
    assert unwritable["host"] == str(tmp_path / "ws")
    assert f"runs as {OTHER}" in unwritable["problem"] and f"chown -R {OTHER}" in unwritable["fix"]
    text = run_cli("explain", "--session", "agent:main:x", config=config).stdout
    assert "WARNING" in text and "sandbox.docker.user" in text


def test_explain_is_quiet_for_read_only_workspaces(tmp_path: Path) -> None:
    """A read-only workspace is meant not to be written: nothing to warn about."""
    data = json.loads(
        run_cli("explain", "--session", "agent:main:x", "--json", config=_config(tmp_path, access="ro")).stdout
    )
    assert data["container"]["unwritable"] == []


def test_audit_reports_sbx_m008(tmp_path: Path) -> None:
    """The config audit reports SBX-M008 (medium) with the chown / docker.user fix."""
    run = run_cli("audit", "--no-engine", "--json", config=_config(tmp_path))
    found = [f for f in json.loads(run.stdout)["findings"] if f["rule"] == "SBX-M008"]
    assert len(found) == 1 and found[0]["severity"] == "medium"
    assert f"chown -R {OTHER} {tmp_path / 'ws'}" in found[0]["fix"]


@pytest.mark.slow
def test_doctor_warns_without_an_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor's workspace check needs no engine: it warns even when the engine is unreachable."""
    [check] = workspace_checks(load_config(_config(tmp_path)))
    assert check.status == "warn" and "sandbox.docker.user" in check.fix
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    run = run_cli("doctor", "--json", config=_config(tmp_path))
    checks = {c["name"]: c for c in json.loads(run.stdout)}
    assert checks["engine"]["status"] == "fail" and checks["workspace main"]["status"] == "warn"


@as_root
def test_root_owned_workspace_with_the_default_user(tmp_path: Path) -> None:
    """The issue's case: a root-owned rw workspace and no docker.user runs as 1000:1000 and is
    reported; after the suggested chown nothing is."""
    config = _config(tmp_path, user=None)
    os.chown(tmp_path / "ws", 0, 0)
    [unwritable] = json.loads(run_cli("explain", "--session", "agent:main:x", "--json", config=config).stdout)[
        "container"
    ]["unwritable"]
    assert "owned by 0:0" in unwritable["problem"] and "chown -R 1000:1000" in unwritable["fix"]
    os.chown(tmp_path / "ws", 1000, 1000)
    assert (
        json.loads(run_cli("explain", "--session", "agent:main:x", "--json", config=config).stdout)["container"][
            "unwritable"
        ]
        == []
    )
    assert workspace_checks(load_config(config))[0].status == "ok"
