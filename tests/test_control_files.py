"""Issue 16 item 5: control files (skills dirs, the config file, the state dir, hook code) never lie
where a sandbox can write; loading refuses it, the audit flags it, `audit mounts` shows the effective mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.audit.control_rules import control_findings
from sandbox.audit.run import mount_map
from sandbox.config import load_config
from sandbox.config.models import Config
from sandbox.config.plugins import hook_entry_points
from sandbox.engine.hooks import Hooks
from sandbox.errors import ConfigError


def _repo(tmp_path: Path, body: str) -> Path:
    repo = tmp_path / "repo"
    (repo / ".skills" / "fmt").mkdir(parents=True)
    (repo / ".skills" / "fmt" / "SKILL.md").write_text("---\nname: fmt\ndescription: x\n---\n")
    (repo / ".skills" / "fmt" / "handler.py").write_text("print('{}')\n")
    cfg = repo / "sandbox.yaml"
    cfg.write_text(body)
    return cfg


REPO_ROOT_CONFIG = """
state_dir: {state}
skills: {{dirs: [./.skills]}}
agents:
  defaults: {{sandbox: {{mode: non-main, workspace_access: rw}}}}
  list: [{{id: main, workspace: .}}]
"""


def test_repo_root_config_with_rw_workspace_is_refused(tmp_path: Path) -> None:
    """`workspace: .` rw with `.skills` and the config in it: refused, naming each path, the agent and the fix."""
    cfg = _repo(tmp_path, REPO_ROOT_CONFIG.format(state=tmp_path / "state"))
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    text = str(err.value)
    repo = cfg.parent.resolve()
    assert f"the skills dir {repo / '.skills'} lies inside the workspace (workspace_access rw) {repo}" in text
    assert f"the config file {cfg.resolve()} lies inside" in text
    assert "agent 'main' (agents.list[0])" in text and "move the skills dir outside every writable workspace" in text
    assert f"{cfg}:" in text  # located in the file


def test_read_only_workspace_with_the_same_layout_loads(tmp_path: Path) -> None:
    """The same layout with workspace_access ro loads: nothing of it is writable from a sandbox."""
    cfg = _repo(tmp_path, REPO_ROOT_CONFIG.format(state=tmp_path / "state").replace("access: rw", "access: ro"))
    assert load_config(cfg).source_file == cfg.resolve()


def test_state_dir_in_a_rw_bind_and_skills_in_a_scratch_root_are_refused(tmp_path: Path) -> None:
    """The state dir below a rw bind, a skills dir below the scratch root: both refused at their keys."""
    shared = tmp_path / "shared"
    (shared / "state").mkdir(parents=True)
    (tmp_path / "scratch" / "skills").mkdir(parents=True)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {shared}/state\nskills: {{dirs: [{tmp_path}/scratch/skills]}}\n"
        "agents:\n  list:\n"
        f"    - {{id: a, workspace: {tmp_path}/wa, sandbox: {{workspace_access: ro, "
        f"docker: {{binds: ['{shared}:/mnt/shared:rw']}}}}}}\n"
        f"    - {{id: b, sandbox: {{workspace_access: none, workspace_root: {tmp_path}/scratch}}}}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    text = str(err.value)
    assert "agents.list[0].sandbox.docker.binds[0]" in text and f"the state dir {shared}/state lies inside" in text
    assert "agents.list[1].sandbox.workspace_root" in text and "the skills dir" in text and "scratch root" in text


def test_hook_code_inside_a_rw_workspace_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook plugin (entry point agent_sandbox.hooks) whose module lives in a rw workspace is refused."""
    ws = tmp_path / "ws"
    (ws / "myhook-1.0.dist-info").mkdir(parents=True)
    (ws / "myhook-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: myhook\nVersion: 1.0\n")
    (ws / "myhook-1.0.dist-info" / "entry_points.txt").write_text("[agent_sandbox.hooks]\nh = myhookmod:register\n")
    (ws / "myhookmod.py").write_text("def register(hooks): pass\n")
    monkeypatch.syspath_prepend(str(ws))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\nagents: {{list: [{{id: a, workspace: {ws}, "
        "sandbox: {workspace_access: rw}}]}\n"
    )
    with pytest.raises(ConfigError, match=r"the hook module .*myhookmod.py lies inside the workspace"):
        load_config(cfg)


def test_the_hook_plugins_the_check_looks_at_are_the_ones_loaded_and_a_new_path_is_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hook plugins are found once per sys.path (reading every distribution's metadata each time
    cost 13 ms per config loaded): a folder added to sys.path is looked at again, and the loader
    gets the very entry points the isolation check looked at."""
    assert not [ep for ep in hook_entry_points() if ep.name == "probe"]
    site = tmp_path / "site"
    (site / "probe-1.0.dist-info").mkdir(parents=True)
    (site / "probe-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: probe\nVersion: 1.0\n")
    (site / "probe-1.0.dist-info" / "entry_points.txt").write_text(
        "[agent_sandbox.hooks]\nprobe = probehook:register\n"
    )
    (site / "probehook.py").write_text(
        "async def deny(ctx, tool, params):\n    return None\n\ndef register(hooks):\n    hooks.add_before(deny, 'probe')\n"
    )
    monkeypatch.syspath_prepend(str(site))
    found = hook_entry_points()
    assert [ep.name for ep in found if ep.name == "probe"] == ["probe"]
    assert hook_entry_points() is found  # asked again: the same answer, no metadata read again
    hooks = Hooks()
    assert "probe" in hooks.load_entry_points() and [name for name, _ in hooks.before] == ["probe"]


def test_audit_flags_control_files_and_shows_the_effective_mode(tmp_path: Path) -> None:
    """A config built in code (never loaded) with skills in a rw workspace: SBX-K001 critical; the
    skills mount, ro in the sandbox, shows as rw in `audit mounts` (writable through the workspace)."""
    ws = tmp_path / "ws"
    (ws / ".skills").mkdir(parents=True)
    config = Config.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "skills": {"dirs": [str(ws / ".skills")]},
            "agents": {"list": [{"id": "a", "workspace": str(ws), "sandbox": {"workspace_access": "rw"}}]},
        }
    )
    findings = control_findings(config)
    assert [(f.rule, f.severity) for f in findings] == [("SBX-K001", "critical")]
    assert "skills dir" in findings[0].evidence and "agent a" in findings[0].evidence
    rows = mount_map(config)["agent a (config)"]
    skills_row = next(r for r in rows if r["container"] == "/opt/skills/0")
    assert skills_row["mode"] == "rw" and skills_row["verdict"] == "SBX-M007"
    assert "writable via agent a (config): /workspace (rw)" in skills_row["from"]


def test_a_rw_workspace_holding_the_orchestrators_code_is_refused(tmp_path: Path) -> None:
    """The folder of the `sandbox` package itself (found from the config module, not by importing the
    package) is a control path: a rw workspace that holds it is refused, naming that folder."""
    import os

    import sandbox

    package = Path(os.path.realpath(os.path.dirname(sandbox.__file__)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\nagents: {{list: [{{id: a, workspace: {package.parent}, "
        "sandbox: {workspace_access: rw}}]}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert f"the orchestrator code {package} lies inside the workspace (workspace_access rw) {package.parent}" in str(
        err.value
    )
