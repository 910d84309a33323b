"""The runtime CLI end to end in subprocesses against the real engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]
ROOT = Path(__file__).resolve().parent.parent


def cli(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, config=cfg)


@pytest.fixture
def cfg(tmp_path: Path, instance: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\n"
        "agents: {defaults: {sandbox: {mode: non-main, scope: session, prune: {idle_hours: 0.0001}}}}\n"
    )
    return path


def test_call_exit_codes(cfg: Path) -> None:
    """`call` prints the ToolResult JSON and exits 0 ok / 1 error / 2 usage."""
    ok = cli(cfg, "call", "--session", "agent:main:c1", "exec", '{"command": "echo hi"}')
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["ok"] and result["output"]["output"] == "hi\n"
    assert set(result) == {
        "ok",
        "tool",
        "call_id",
        "trace_id",
        "output",
        "error",
        "truncated",
        "full_output_path",
        "duration_ms",
        "warnings",
    }
    denied = cli(cfg, "call", "--session", "agent:main:c1", "browser", '{"action": "navigate"}')
    assert denied.returncode == 1 and json.loads(denied.stdout)["error"]["code"] == "TOOL_NOT_FOUND"
    bad = cli(cfg, "call", "--session", "agent:main:c1", "exec", "{not json")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr


def test_exec_for_people(cfg: Path) -> None:
    """`exec -- CMD` prints output and exits with the command's exit code."""
    run = cli(cfg, "exec", "--session", "agent:main:e1", "--", "sh", "-c", "echo out; exit 3")
    assert run.returncode == 3 and run.stdout == "out\n"


def test_list_recreate_prune(cfg: Path) -> None:
    """list shows the sandbox; prune --dry-run names it as idle; recreate removes it."""
    assert cli(cfg, "call", "--session", "agent:main:l1", "exec", '{"command": "true"}').returncode == 0
    listed = json.loads(cli(cfg, "list", "--json").stdout)
    assert len(listed) == 1 and listed[0]["scope_key"] == "agent:main:l1" and listed[0]["config_match"] is True
    import time

    time.sleep(1.0)
    dry = json.loads(cli(cfg, "prune", "--dry-run", "--json").stdout)
    assert [p["name"] for p in dry["pruned"]] == [listed[0]["name"]] and "idle" in dry["pruned"][0]["reason"]
    assert len(json.loads(cli(cfg, "list", "--json").stdout)) == 1
    removed = json.loads(cli(cfg, "recreate", "--session", "agent:main:l1", "--json").stdout)
    assert removed["removed"] == [listed[0]["name"]]
    assert json.loads(cli(cfg, "list", "--json").stdout) == []
    assert cli(cfg, "recreate").returncode == 2


def test_prune_applies_each_agents_own_rules(tmp_path: Path, instance: str) -> None:
    """prune judges a sandbox by its own agent's rules: one whose agent prunes after a moment is
    named, one whose agent never prunes is kept, whatever the defaults say."""
    cfg = tmp_path / "agents.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, prune: {idle_hours: 0.0001}}}, "
        "list: [{id: quick}, {id: keeper, sandbox: {prune: {idle_hours: 0, max_age_days: 0}}}]}\n"
    )
    for session in ("agent:quick:p1", "agent:keeper:p2"):
        assert cli(cfg, "call", "--session", session, "exec", '{"command": "true"}').returncode == 0
    listed = {row["agent"]: row for row in json.loads(cli(cfg, "list", "--json").stdout)}
    assert set(listed) == {"quick", "keeper"} and all(row["config_match"] for row in listed.values())
    import time

    time.sleep(1.0)
    dry = json.loads(cli(cfg, "prune", "--dry-run", "--json").stdout)
    assert [p["name"] for p in dry["pruned"]] == [listed["quick"]["name"]]
    assert len(json.loads(cli(cfg, "list", "--json").stdout)) == 2  # a dry run removes nothing
    assert cli(cfg, "recreate", "--all").returncode == 0


def test_prune_removes_leftover_file_locks_but_not_a_held_one(cfg: Path, tmp_path: Path) -> None:
    """Lock files an older version left (or a process that died holding one) go with prune."""
    import fcntl

    locks = tmp_path / "state" / "locks"
    locks.mkdir(parents=True)
    for name in ("left", "held"):
        (locks / f"{name}.lock").write_text("")
    held = os.open(locks / "held.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        dry = json.loads(cli(cfg, "prune", "--dry-run", "--json").stdout)
        assert dry["lock_files_removed"] == 0 and len(list(locks.iterdir())) == 2
        pruned = cli(cfg, "prune", "--json")
        assert pruned.returncode == 0, pruned.stderr
        assert json.loads(pruned.stdout)["lock_files_removed"] == 1
    finally:
        os.close(held)
    assert [p.name for p in locks.iterdir()] == ["held.lock"]


def test_list_marks_stale_config(cfg: Path, tmp_path: Path) -> None:
    """A sandbox whose config changed since creation is listed as not matching."""
    assert cli(cfg, "call", "--session", "agent:main:s1", "exec", '{"command": "true"}').returncode == 0
    cfg.write_text(cfg.read_text().replace("prune:", "docker: {env: {NEW: '1'}}, prune:"))
    listed = json.loads(cli(cfg, "list", "--json").stdout)
    assert listed[0]["config_match"] is False


def test_explain_shows_container_and_mounts(cfg: Path) -> None:
    """explain of a sandboxed session names its container, hardening and mounts."""
    data = json.loads(cli(cfg, "explain", "--session", "agent:main:x", "--json").stdout)
    container = data["container"]
    assert container["name"].startswith("sbx-") and container["user"] == "1000:1000"
    assert container["hardening"]["network"] == "none" and container["hardening"]["cap_drop"] == ["ALL"]
    assert container["mounts"][0]["container"] == "/workspace"
    assert "seccomp=strict" in " ".join(container["hardening"]["security_opt"])
    assert container["session_users"] is False  # scope: session, one session per container


def test_doctor_all_ok_and_images_idempotent(cfg: Path) -> None:
    """doctor reports every check ok on this machine; images build twice skips the second time."""
    doctor = cli(cfg, "doctor", "--json")
    checks = json.loads(doctor.stdout)
    assert doctor.returncode == 0, checks
    assert {c["status"] for c in checks} == {"ok"}, checks
    (path,) = [c for c in checks if c["name"] == "exec path"]
    assert "agent (resident agent /usr/local/lib/sandbox-agent/agent.pyc)" in path["detail"], path
    assert "two FIFOs beside the engine" in path["detail"], path
    build = cli(cfg, "images", "build")
    assert build.returncode == 0 and "up to date" in build.stderr + build.stdout


def test_demo_runs_end_to_end() -> None:
    """The README demo drives real sandboxes with the default policy and every step behaves."""
    env = dict(os.environ)  # XDG_STATE_HOME is this run's (conftest): nothing lands in the repo
    run = subprocess.run(
        [sys.executable, "-m", "sandbox", "--config", "policies/default.yaml", "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and all(step["ok"] for step in report["steps"])
    assert report["control"] == {"approval_ok": True, "loop_stopped": True}
    assert report["sandbox"]["network"] == "none" and report["sandbox"]["read_only_root"] is True
    subprocess.run(
        [sys.executable, "-m", "sandbox", "--config", "policies/default.yaml", "recreate", "--all"],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


def test_call_runs_a_skill_in_the_sandbox(tmp_path: Path, instance: str) -> None:
    """`sandbox call` on a skill runs it in the session's sandbox."""
    cfg = tmp_path / "skills.yaml"
    cfg.write_text(
        (ROOT / "policies" / "examples" / "skills.yaml")
        .read_text()
        .replace("version: 1\n", f"version: 1\nstate_dir: {tmp_path}/state\ninstance: {instance}\n")
        .replace("../../skills", str(ROOT / "skills"))
    )
    assert (
        cli(cfg, "call", "--session", "agent:main:sk", "write", '{"path": "f.txt", "content": "1\\n2\\n"}').returncode
        == 0
    )
    run = cli(cfg, "call", "--session", "agent:main:sk", "line_count", '{"pattern": "*.txt"}')
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["output"]["lines"] == 2


def test_doctor_says_when_commands_take_docker_exec(tmp_path: Path, instance: str) -> None:
    """With the agent off, doctor warns that every command pays a Docker exec round trip, and says why."""
    path = tmp_path / "off.yaml"
    path.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\n"
        "agents: {defaults: {sandbox: {mode: all, docker: {agent: 'off'}}}}\n"
    )
    checks = json.loads(cli(path, "doctor", "--json").stdout)
    (found,) = [c for c in checks if c["name"] == "exec path"]
    assert found["status"] == "warn" and "docker.agent is off" in found["detail"], found
