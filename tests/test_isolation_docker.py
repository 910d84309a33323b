"""Attacks on the lines between agents, tenants and the host, performed against the real engine."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.config import effective_agent, load_config_text
from sandbox.config.models import Config
from sandbox.runtime.spec import spec_from_config
from tests.cli_helpers import run_cli

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


def unvalidated(data: dict[str, Any], tmp_path: Path) -> Config:
    # a config built in code: models only, the load-time cross-agent rules never ran
    return Config.model_validate(data, context={"base_dir": tmp_path})


def workspace(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 1000, 1000)
    return path


async def test_shared_scope_never_hands_one_agents_container_to_another(tmp_path: Path, instance: str) -> None:
    """Shared scope, different workspaces: loading refuses; without loading, B is refused and A's command lives."""
    wa, wb = workspace(tmp_path / "wa"), workspace(tmp_path / "wb")
    (wa / "a-secret.txt").write_text("A only")
    data = {
        "state_dir": str(tmp_path / "s"),
        "instance": instance,
        "agents": {
            "defaults": {"sandbox": {"mode": "all", "scope": "shared", "workspace_access": "rw"}},
            "list": [{"id": "a", "workspace": str(wa)}, {"id": "b", "workspace": str(wb)}],
        },
    }
    cfg = tmp_path / "c.json"
    import json

    cfg.write_text(json.dumps(data))
    check = run_cli("config", "check", config=cfg)
    assert check.returncode == 2 and "agents.list[1].sandbox.scope" in check.stderr and "workspace" in check.stderr
    call = run_cli("call", "--session", "agent:b:x", "exec", '{"command": "true"}', config=cfg)
    assert call.returncode == 2 and "scope shared" in call.stderr

    async with Orchestrator(unvalidated(data, tmp_path), journal=False) as orch:
        a, b = orch.session("agent:a:x"), orch.session("agent:b:x")
        first = await a.call("exec", {"command": "true"})
        assert first.ok
        results: dict[str, Any] = {}

        async def run_a() -> None:
            results["a"] = await a.call("exec", {"command": "sleep 2; cat a-secret.txt"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_a)
            await anyio.sleep(0.5)
            results["b"] = await b.call("exec", {"command": "cat /workspace/a-secret.txt"})
        assert results["b"].error.code == "SANDBOX_UNAVAILABLE", results["b"]
        assert results["a"].ok and results["a"].output["exit_code"] == 0, results["a"]
        assert "A only" in results["a"].output["output"]
        read = await b.call("read", {"path": "a-secret.txt"})
        assert not read.ok


async def test_tenants_never_share_a_container_or_scratch_dir(
    tmp_path: Path, instance: str, docker_client: Any
) -> None:
    """Scope shared across two tenants (validation skipped): two containers, two scratch dirs, nothing seen across."""
    data = {
        "state_dir": str(tmp_path / "s"),
        "instance": instance,
        "agents": {
            "defaults": {"sandbox": {"mode": "all", "scope": "shared"}},
            "list": [{"id": "a", "tenant": "t1"}, {"id": "b", "tenant": "t2"}],
        },
    }
    async with Orchestrator(unvalidated(data, tmp_path), journal=False) as orch:
        a, b = orch.session("agent:a:x"), orch.session("agent:b:x")
        assert (await a.call("exec", {"command": "echo t1 > mine.txt"})).ok
        seen = await b.call("exec", {"command": "ls /workspace; cat mine.txt"})
        assert seen.ok and seen.output["exit_code"] != 0 and "t1" not in seen.output["output"]
        box_a, box_b = await a.sandbox(), await b.sandbox()
        assert box_a.id != box_b.id and box_a.spec.mounts[0].source != box_b.spec.mounts[0].source
        labels = docker_client.containers.get(box_b.id).labels
        assert labels["io.agent-sandbox.tenant"] == "t2"


async def test_scratch_link_to_a_root_owned_dir_is_refused(tmp_path: Path, make_config: Any) -> None:
    """A link planted at the scratch path: no mkdir or chown through it; the target keeps owner and contents."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: session}}}")
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "root-only").write_text("x")
    os.chown(victim, 0, 0)
    before = victim.stat()
    scratch = Path(spec_from_config(config, effective_agent(config, "main"), "agent:main:x", "i").mounts[0].source)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    scratch.symlink_to(victim)
    async with Orchestrator(config, journal=False) as orch:
        result = await orch.session("agent:main:x").call("exec", {"command": "touch /workspace/pwned; id"})
    assert not result.ok and result.error.code in ("SANDBOX_UNAVAILABLE", "PERMISSION_DENIED"), result
    assert "link" in result.error.message
    after = victim.stat()
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (before.st_uid, before.st_gid, 0o700)
    assert sorted(os.listdir(victim)) == ["root-only"]


def git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True, text=True).stdout


async def test_exec_cannot_write_git_hooks_or_config(tmp_path: Path, make_config: Any) -> None:
    """rw workspace with a repo and a submodule git dir: hooks and config are read-only to exec, .git stays put."""
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q")
    (ws / ".git/modules/sub/hooks").mkdir(parents=True)
    (ws / ".git/modules/sub/config").write_text("[core]\n")
    subprocess.run(["chown", "-R", "1000:1000", str(ws)], check=True)
    config_before = (ws / ".git/config").read_text()
    config = make_config(
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: agent, workspace_access: rw}}}}, "
        f"list: [{{id: a, workspace: '{ws}'}}]}}"
    )
    async with Orchestrator(config, journal=False) as orch:
        s = orch.session("agent:a:x")

        async def sh(command: str) -> dict[str, Any]:
            result = await s.call("exec", {"command": command})
            assert result.ok, result
            return dict(result.output)

        for attack in (
            "echo 'touch /tmp/pwned' > .git/hooks/pre-commit",
            "git config core.fsmonitor 'touch /tmp/pwned'",
            "echo '[core] fsmonitor = x' >> .git/config",
            "echo x > .git/modules/sub/hooks/post-checkout",
            "echo '[core] fsmonitor = x' >> .git/modules/sub/config",
            "mv .git .git-aside",
            "mv .git/modules/sub .git/modules/sub2",
            "rm -rf .git/hooks",
        ):
            out = await sh(attack)
            assert out["exit_code"] != 0, (attack, out)
        ok = await sh("git -c user.email=a@b -c user.name=a commit -q --allow-empty -m work && git log --oneline")
        assert ok["exit_code"] == 0 and "work" in ok["output"]
        for path in (".git/config", ".git/modules/sub/config", ".git/hooks/x"):
            refused = await s.call("write", {"path": path, "content": "[core]\n\tfsmonitor = x\n"})
            assert refused.error.code == "PERMISSION_DENIED" and "protected path" in refused.error.message
    assert (ws / ".git/config").read_text() == config_before
    assert not (ws / ".git/hooks/pre-commit").exists() and not (ws / ".git/modules/sub/hooks/post-checkout").exists()
    assert (ws / ".git").is_dir() and not (ws / ".git-aside").exists()


async def test_protected_paths_are_made_before_a_repo_exists(tmp_path: Path, make_config: Any) -> None:
    """A workspace with no repo gets .git/hooks and an empty .git/config (owned by its owner), read-only inside."""
    ws = tmp_path / "plain"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    config = make_config(
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: agent, workspace_access: rw}}}}, "
        f"list: [{{id: a, workspace: '{ws}'}}]}}"
    )
    async with Orchestrator(config, journal=False) as orch:
        result = await orch.session("agent:a:x").call(
            "exec",
            {"command": "echo x > .git/hooks/post-checkout || echo refused; echo y >> .git/config || echo refused"},
        )
    assert result.ok and result.output["output"].count("refused") == 2, result
    assert (ws / ".git/hooks").is_dir() and (ws / ".git/config").read_bytes() == b""
    assert (ws / ".git/hooks").stat().st_uid == 1000 and (ws / ".git/config").stat().st_uid == 1000


def test_cli_refuses_session_keys_that_trim_to_main(tmp_path: Path) -> None:
    """`--session " agent:main:main "` and a key with a newline exit 2 with a clear message (never run on the host)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"state_dir: {tmp_path}/s\n")
    for key in (" agent:main:main ", "main\n", "\tmain"):
        run = run_cli("call", "--session", key, "exec", '{"command": "touch /tmp/should-not-run"}', config=cfg)
        assert run.returncode == 2 and "session key" in run.stderr, run.stderr
    assert load_config_text(cfg.read_text())  # the config itself is fine
