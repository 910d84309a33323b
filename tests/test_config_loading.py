"""Config loading resists hostile files: alias bombs, recursive aliases, repeated keys, roots that
hold everything, and configs that would silently share one instance (issue 16 items 10, 15, 17, 18)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sandbox.config import load_config, load_config_text
from sandbox.config.merge import agent_ids, effective_agent
from sandbox.errors import ConfigError
from sandbox.runtime.naming import container_name, instance_id, scope_key
from sandbox.runtime.spec import scratch_workspace

# 7 levels of 9 aliases each: 9**7 (4.8 million) nodes from under 300 bytes
BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{b}: &{b} [{','.join([f'*{a}'] * 9)}]" for a, b in zip("abcdef", "bcdefg", strict=True)]
)


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.problems


def test_alias_bomb_fails_fast_with_a_located_error(tmp_path: Path) -> None:
    """A 300-byte billion-laughs file is refused in well under a second, at the node that explodes."""
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB + "\n")
    assert cfg.stat().st_size < 400
    started = time.monotonic()
    found = problems_of(cfg)
    assert time.monotonic() - started < 0.5
    assert len(found) == 1 and found[0].startswith(f"{cfg}:6:")
    assert "config refused: aliases expand this to more than 100000 nodes" in found[0]


def test_alias_bomb_inside_a_real_key_fails_fast() -> None:
    """A bomb hidden under a real key (tools.deny) is refused before validation walks it."""
    text = "x: &x [read, read, read, read, read, read, read, read, read, read]\n"
    for i in range(1, 7):
        text += f"x{i}: &x{i} [{', '.join([f'*x{i - 1}' if i > 1 else '*x'] * 10)}]\n"
    text += "tools:\n  deny: *x6\n"
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_config_text(text, source="c.yaml")
    assert time.monotonic() - started < 0.5
    assert "config refused" in info.value.problems[0]


def test_recursive_alias_is_a_config_error_not_a_traceback(tmp_path: Path) -> None:
    """`a: &a [*a]` is a located config error (it used to raise RecursionError)."""
    cfg = tmp_path / "rec.yaml"
    cfg.write_text("tools:\n  deny: &a [exec, *a]\n")
    assert problems_of(cfg) == [f"{cfg}:2:19: config refused: recursive alias *a (the anchor contains itself)"]
    mapping = tmp_path / "recmap.yaml"
    mapping.write_text("tools: &t\n  sandbox: *t\n")
    assert "recursive alias *t" in problems_of(mapping)[0]


@pytest.mark.slow
def test_deep_nesting_is_refused_without_a_traceback() -> None:
    """Thousands of nested brackets give a config error, not a RecursionError."""
    with pytest.raises(ConfigError) as info:
        load_config_text("x: " + "[" * 5000 + "]" * 5000, source="c.yaml")
    assert "config refused: nested deeper than 64 levels" in info.value.problems[0]


def test_ordinary_aliases_still_load() -> None:
    """Anchors, aliases and merge keys used the normal way keep working."""
    text = (
        "agents:\n"
        "  defaults:\n    sandbox: &sb {scope: agent, mode: all}\n"
        "  list:\n    - id: a\n      sandbox: {<<: *sb, scope: session}\n"
        "tools:\n  deny: &d [exec, process]\n  sandbox:\n    tools:\n      deny: *d\n"
    )
    loaded = load_config_text(text, source="c.yaml")
    assert loaded.tools.deny == ["exec", "process"] and loaded.tools.sandbox.tools.deny == ["exec", "process"]
    assert loaded.agents.list[0].sandbox.scope == "session" and loaded.agents.list[0].sandbox.mode == "all"


def test_duplicate_yaml_key_is_an_error_with_both_locations(tmp_path: Path) -> None:
    """A later `tools:` block can no longer silently empty `deny: [exec]`: both places are named."""
    cfg = tmp_path / "dup.yaml"
    cfg.write_text("tools:\n  deny: [exec]\nagents: {}\ntools:\n  allow: [read]\n")
    assert problems_of(cfg) == [
        f"{cfg}:4:1: duplicate key 'tools' (first at line 1:1); keys may appear once per mapping"
    ]


def test_duplicate_nested_and_respelled_keys_are_errors() -> None:
    """Repeats at any depth are caught, as are two spellings of one YAML value (`true`/`yes`)."""
    with pytest.raises(ConfigError) as info:
        load_config_text("tools:\n  deny: [exec]\n  deny: []\nx: {true: 1, yes: 2}\n", source="c.yaml")
    assert info.value.problems == [
        "c.yaml:3:3: duplicate key 'deny' (first at line 2:3); keys may appear once per mapping",
        "c.yaml:4:14: duplicate key 'yes' (first at line 4:5); keys may appear once per mapping",
    ]


def test_duplicate_json_key_is_an_error_with_both_locations(tmp_path: Path) -> None:
    """JSON configs get the same check: `{"tools": {"deny": ["exec"], "deny": []}}` is refused."""
    cfg = tmp_path / "dup.json"
    cfg.write_text('{"tools": {"deny": ["exec"],\n  "deny": []}}\n')
    assert problems_of(cfg) == [
        f"{cfg}:2:3: duplicate key 'deny' (first at line 1:12); keys may appear once per mapping"
    ]


@pytest.mark.parametrize("root", ["/", "/etc", "/home", "/var/lib/docker", "/root", "~", "/run"])
def test_workspace_root_holding_the_host_is_refused(tmp_path: Path, root: str) -> None:
    """`workspace_root: /` (or a system path or home) would exempt every mount from the audit: refused."""
    text = f"state_dir: {tmp_path}\nagents:\n  list:\n    - id: a\n      sandbox: {{workspace_root: '{root}'}}\n"
    with pytest.raises(ConfigError) as info:
        load_config_text(text, source="c.yaml")
    ours = [p for p in info.value.problems if "workspace_root: workspace_root" in p]
    assert len(ours) == 1 and ours[0].startswith("c.yaml:5:33: agents.list[0].sandbox.workspace_root: ")


def test_workspace_root_in_defaults_is_checked_too(tmp_path: Path) -> None:
    """The defaults' workspace_root gets the same check; a project folder is fine."""
    with pytest.raises(ConfigError):
        load_config_text("agents: {defaults: {sandbox: {workspace_root: /}}}", source="c.yaml")
    ok = load_config_text(f"agents: {{defaults: {{sandbox: {{workspace_root: {tmp_path}/scratch}}}}}}")
    assert ok.agents.defaults.sandbox.workspace_root == tmp_path / "scratch"


def _sandbox_identity(path: Path) -> tuple[str, str, Path]:
    """(instance id, container name, scratch workspace) of the first agent of a config file."""
    config = load_config(path)
    agent = effective_agent(config, agent_ids(config)[0])
    instance = instance_id(config.state_dir, config.instance)
    key = scope_key(agent.sandbox.scope, agent.id, f"agent:{agent.id}:s1")
    return instance, container_name(instance, "exec", key, tenant=agent.tenant), scratch_workspace(agent, key)


def test_two_configs_without_state_dir_get_different_instances(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two configs that set no state_dir never share an instance id, a container or a scratch workspace."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    chat = tmp_path / "chat" / "sandbox.yaml"
    coding = tmp_path / "coding" / "sandbox.yaml"
    for cfg, deny in ((chat, "[exec]"), (coding, "[]")):
        cfg.parent.mkdir()
        cfg.write_text(f"tools:\n  deny: {deny}\n")
    first, second = _sandbox_identity(chat), _sandbox_identity(coding)
    assert first[0] != second[0] and first[1] != second[1] and first[2] != second[2]
    assert load_config(chat).state_dir.parent == tmp_path / "xdg" / "agent-sandbox" / "configs"
    # the same file read again (through another spelling of its path) is the same instance
    assert _sandbox_identity(tmp_path / "chat" / ".." / "chat" / "sandbox.yaml") == first


def test_sharing_an_instance_takes_an_explicit_state_dir(tmp_path: Path) -> None:
    """Two configs naming one state_dir share it (the explicit way to share), and so one instance."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"state_dir: {tmp_path}/state\n")
    b.write_text(f"state_dir: {tmp_path}/state\ntools: {{deny: [exec]}}\n")
    assert _sandbox_identity(a)[0] == _sandbox_identity(b)[0]


def test_text_configs_get_their_own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Config text without state_dir (the CLI's built-in defaults) gets a state dir of its own content."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    one = load_config_text("{}", source="<defaults>", base_dir=tmp_path)
    same = load_config_text("{}", source="<defaults>", base_dir=tmp_path)
    other = load_config_text("tools: {deny: [exec]}", source="<defaults>", base_dir=tmp_path)
    assert one.state_dir == same.state_dir != other.state_dir
    assert one.state_dir.name.startswith("defaults-")


def test_root_keeps_its_state_outside_its_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root without XDG_STATE_HOME keeps state in /var/lib/agent-sandbox (scratch under /root would be refused)."""
    from sandbox.config import models

    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert models.default_state_dir() == Path("/var/lib/agent-sandbox")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setenv("HOME", "/home/bob")
    assert models.default_state_dir() == Path("/home/bob/.local/state/agent-sandbox")
    monkeypatch.setenv("XDG_STATE_HOME", "/tmp/x")
    assert models.default_state_dir() == Path("/tmp/x/agent-sandbox")
