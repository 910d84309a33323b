"""Every kind of config error gives its precise, located message (pure, fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.config import effective_agent, load_config, load_config_text
from sandbox.errors import ConfigError


def problems(text: str, tmp_path: Path | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, source="cfg.yaml", base_dir=tmp_path or Path("/tmp"))
    return info.value.problems


def test_unknown_key_has_path_line_and_suggestion() -> None:
    """An unknown key names its full path, file:line:col and the closest valid key."""
    text = "agents:\n  defaults:\n    sandbox:\n      workspaceAcess: ro\n"
    assert problems(text) == [
        "cfg.yaml:4:7: agents.defaults.sandbox.workspaceAcess: unknown key 'workspaceAcess'; "
        "did you mean 'workspace_access'?"
    ]


def test_unknown_key_in_list_item() -> None:
    """Keys inside agents.list items are located with their index."""
    text = "agents:\n  list:\n    - id: a\n      tols: {}\n"
    assert problems(text) == ["cfg.yaml:4:7: agents.list[0].tols: unknown key 'tols'; did you mean 'tools'?"]


def test_camel_case_aliases_accepted() -> None:
    """OpenClaw's camelCase spellings load as their snake_case keys."""
    config = load_config_text(
        "tools: {byProvider: {acme: {deny: [exec]}}, alsoAllow: [read]}\n"
        "agents: {defaults: {sandbox: {workspaceAccess: ro, docker: {readOnlyRoot: false, pidsLimit: 64}}}}\n"
    )
    assert "acme" in config.tools.by_provider
    sandbox = config.agents.defaults.sandbox
    assert sandbox.workspace_access == "ro"
    assert sandbox.docker.read_only_root is False and sandbox.docker.pids_limit == 64


def test_wrong_type_says_what_was_expected() -> None:
    """A wrong type names the key and the expected type, with the bad value."""
    assert problems("agents: {defaults: {sandbox: {docker: {pids_limit: lots}}}}") == [
        "cfg.yaml:1:52: agents.defaults.sandbox.docker.pids_limit: input should be a valid integer, "
        "unable to parse string as an integer (got 'lots')"
    ]


def test_bad_enum_value() -> None:
    """A value outside an enum lists the allowed values."""
    assert problems("agents:\n  defaults:\n    sandbox:\n      scope: galaxy\n") == [
        "cfg.yaml:4:14: agents.defaults.sandbox.scope: input should be 'session', 'agent' or 'shared' (got 'galaxy')"
    ]


def test_unknown_tool_and_group_list_near_matches() -> None:
    """Unknown tool names and groups in any list are errors with near matches."""
    found = problems("tools:\n  deny: [exce, 'group:fz']\n  allow: ['nothing_*']\n")
    assert found[0] == "cfg.yaml:2:10: tools.deny[0]: unknown tool 'exce'; did you mean exec?"
    assert found[1].startswith("cfg.yaml:2:16: tools.deny[1]: unknown group 'group:fz'; did you mean group:fs")
    assert found[2] == "cfg.yaml:3:11: tools.allow[0]: pattern 'nothing_*' matches no known tool"


def test_yaml_syntax_error_has_line_and_column() -> None:
    """A YAML syntax error is reported as file:line:column."""
    found = problems("tools:\n  deny: [exec\n  allow: x\n")
    assert len(found) == 1
    assert found[0].startswith("cfg.yaml:3:")
    assert "YAML syntax error" in found[0]


def test_all_problems_reported_at_once() -> None:
    """Several problems in one file are all reported, not just the first."""
    assert len(problems("tols: 1\nagents: {defaults: {sandbox: {mode: never}}}\n")) == 2


def test_cross_key_rules() -> None:
    """Duplicate agent ids, two defaults and inverted timeouts are located errors."""
    found = problems(
        "tools: {exec: {default_timeout_s: 100, max_timeout_s: 10}}\n"
        "agents: {list: [{id: a, default: true}, {id: a, default: true}]}\n"
    )
    assert "cfg.yaml:2:46: agents.list[1].id: agent id 'a' repeats agents.list[0]" in found
    assert (
        "cfg.yaml:2:58: agents.list[1].default: tenant 'default' already has a default agent "
        "(agents.list[0].default); only one agent per tenant may be `default: true`"
    ) in found
    assert any("tools.exec.default_timeout_s: must not exceed tools.exec.max_timeout_s" in p for p in found)


def test_relative_paths_resolve_against_config_folder(tmp_path: Path) -> None:
    """Relative paths mean next to the config file; ~ expands to the home."""
    cfg = tmp_path / "conf" / "c.yaml"
    cfg.parent.mkdir()
    cfg.write_text("state_dir: ./state\nagents: {list: [{id: a, workspace: ~/ws}]}\n")
    config = load_config(cfg)
    assert config.state_dir == cfg.parent / "state"
    assert effective_agent(config, "a").workspace == Path.home() / "ws"


def test_missing_file() -> None:
    """A missing config file is a config error naming the file."""
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("/nonexistent/c.yaml")


def test_agent_overrides_defaults_key_by_key_and_binds_concatenate(tmp_path: Path) -> None:
    """Per-agent sandbox values override defaults key by key; binds concatenate."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    config = load_config_text(
        f"""
agents:
  defaults:
    sandbox: {{scope: shared, docker: {{memory: 2g, binds: ["{tmp_path}/a:/mnt/a"]}}}}
  list:
    - id: x
      sandbox: {{docker: {{pids_limit: 99, binds: ["{tmp_path}/b:/mnt/b:rw"]}}}}
"""
    )
    sandbox = effective_agent(config, "x").sandbox
    assert sandbox.scope == "shared"
    assert (sandbox.docker.memory, sandbox.docker.pids_limit) == ("2g", 99)
    assert sandbox.docker.binds == [f"{tmp_path}/a:/mnt/a", f"{tmp_path}/b:/mnt/b:rw"]


def test_blocked_bind_is_a_config_error_with_rule() -> None:
    """A bind of a blocked path fails at load with its key path and rule."""
    found = problems("agents:\n  defaults:\n    sandbox:\n      docker:\n        binds: ['/etc:/mnt/etc']\n")
    assert found == [
        "cfg.yaml:5:17: agents.defaults.sandbox.docker.binds[0]: bind source '/etc' is the system path /etc "
        "[rule system-path]; fix: bind a directory outside system paths, or set "
        "docker.dangerously_allow_system_paths (audited)"
    ]


def test_json_config_loads_and_errors_are_located(tmp_path: Path) -> None:
    """A JSON config loads like YAML, and its errors carry line and column too."""
    good = tmp_path / "c.json"
    good.write_text('{"tools": {"deny": ["exec"]}, "agents": {"list": [{"id": "a"}]}}')
    assert load_config(good).tools.deny == ["exec"]
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "tools": {\n    "dney": ["exec"]\n  }\n}\n')
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert info.value.problems == [f"{bad}:3:5: tools.dney: unknown key 'dney'; did you mean 'deny'?"]


def test_agent_path_takes_a_bare_off_and_names_a_bad_value() -> None:
    """`docker.agent: off` (which YAML reads as false) is `off`; anything else but auto is refused by path."""
    config = load_config_text("agents: {defaults: {sandbox: {docker: {agent: off}}}}\n")
    assert effective_agent(config, "main").sandbox.docker.agent == "off"
    (problem,) = problems("agents:\n  defaults:\n    sandbox:\n      docker: {agent: sometimes}\n")
    assert "agents.defaults.sandbox.docker.agent" in problem and "'auto'" in problem and "'off'" in problem
