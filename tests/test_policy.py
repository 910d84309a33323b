"""Table tests for the layered tool policy (pure, fast)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox.config import load_config, load_config_text
from sandbox.errors import UsageError
from sandbox.policy import Identity, PolicyResolver, ResolvedPolicy
from sandbox.policy.groups import acting_as

EXAMPLES = Path(__file__).resolve().parent.parent / "policies"


def resolve(yaml_text: str, agent: str = "main", session: str = "agent:main:main", **kw: Any) -> ResolvedPolicy:
    config = load_config_text(yaml_text, base_dir=Path("/tmp"))
    return PolicyResolver(config).resolve(Identity(agent=agent, session=session, **kw))


def test_tool_in_both_allow_and_deny_is_denied() -> None:
    """Deny wins over allow in the same layer."""
    policy = resolve("tools: {allow: [exec, read], deny: [exec]}")
    assert "exec" not in policy.allowed
    assert policy.decision("exec").kind == "deny"
    assert "read" in policy.allowed


def test_agent_allow_cannot_restore_global_deny() -> None:
    """No later layer brings back a tool an earlier layer removed."""
    policy = resolve(
        """
tools: {deny: [exec]}
agents: {list: [{id: main, tools: {allow: [exec, read]}}]}
"""
    )
    assert "exec" not in policy.allowed
    decision = policy.decision("exec")
    assert (decision.layer, decision.key) == ("global", "tools.deny")


def test_sandboxed_session_loses_ui_automation_nodes_by_default() -> None:
    """The default sandbox layer denies browser, canvas, nodes, cron, gateway, message."""
    policy = resolve("tools: {profile: full}", session="agent:main:group:1")
    assert policy.sandbox.sandboxed
    for tool in ("browser", "canvas", "nodes", "cron", "gateway", "message"):
        assert tool not in policy.allowed, tool
        assert policy.decision(tool).layer == "sandbox"
    for tool in ("exec", "process", "read", "write", "edit", "apply_patch", "sessions_spawn"):
        assert tool in policy.allowed, tool


def test_non_main_keeps_main_session_on_host() -> None:
    """Mode non-main leaves agent:<id>:main unsandboxed and sandboxes every other key."""
    main = resolve("{}", session="agent:main:main")
    other = resolve("{}", session="agent:main:cron:nightly")
    assert not main.sandbox.sandboxed
    assert "is the agent's main session" in main.sandbox.reason
    assert other.sandbox.sandboxed
    assert "sandbox" not in [t.layer.name for t in main.trace]


def test_mode_all_and_off() -> None:
    """Mode all sandboxes the main session; mode off sandboxes nothing."""
    cfg_all = "agents: {defaults: {sandbox: {mode: all}}}"
    cfg_off = "agents: {defaults: {sandbox: {mode: 'off'}}}"
    assert resolve(cfg_all).sandbox.sandboxed
    assert not resolve(cfg_off, session="agent:main:x").sandbox.sandboxed


def test_groups_wildcards_alias_case() -> None:
    """group:, `*`, the bash alias and upper case all name the right tools."""
    policy = resolve("tools: {allow: [group:fs, 'WEB_*', BASH]}")
    assert policy.allowed == {
        "read",
        "write",
        "edit",
        "apply_patch",
        "web_fetch",
        "web_search",
        "exec",
    }
    assert policy.decision("exec").pattern == "BASH"


def test_apply_patch_follows_write() -> None:
    """Denying write denies apply_patch and edit; allowing write allows every tool that writes files."""
    denied = resolve("tools: {deny: [write]}")
    assert "apply_patch" not in denied.allowed and "edit" not in denied.allowed
    assert denied.decision("apply_patch").pattern == "write"
    assert denied.decision("edit").pattern == "write"
    allowed = resolve("tools: {allow: [write]}")
    assert allowed.allowed == {"write", "edit", "apply_patch"}


@pytest.mark.parametrize(
    ("yaml_text", "session", "gone", "kept"),
    [
        ("tools: {deny: [write]}", "agent:main:main", {"write", "edit", "apply_patch"}, {"read", "exec"}),
        ("tools: {allow: [read, edit], deny: [write]}", "agent:main:main", {"edit", "write"}, {"read"}),
        ("tools: {deny: [edit]}", "agent:main:main", {"edit"}, {"write", "apply_patch", "read"}),
        ("tools: {deny: [apply_patch]}", "agent:main:main", {"apply_patch"}, {"write", "edit"}),
        ("tools: {deny: [w*]}", "agent:main:main", {"write", "edit", "apply_patch", "web_fetch"}, {"read"}),
        ("agents: {list: [{id: main, tools: {deny: [write]}}]}", "agent:main:main", {"edit", "apply_patch"}, {"read"}),
        (
            "agents: {defaults: {sandbox: {mode: all}}}\ntools: {sandbox: {tools: {deny: [write]}}}",
            "agent:main:s",
            {"write", "edit", "apply_patch"},
            {"read", "exec"},
        ),
        ("tools: {allow: [write]}", "agent:main:main", {"read", "exec"}, {"write", "edit", "apply_patch"}),
    ],
)
def test_write_covers_every_tool_that_writes_files(
    yaml_text: str, session: str, gone: set[str], kept: set[str]
) -> None:
    """`write` in any layer's allow or deny names write, edit and apply_patch; `edit` names only edit."""
    policy = resolve(yaml_text, session=session)
    assert not gone & policy.allowed
    assert kept <= policy.allowed


@pytest.mark.parametrize(
    ("tool", "params", "governing"),
    [
        ("process", {"action": "write", "id": "p", "data": "x"}, "exec"),
        ("process", {"action": "kill", "id": "p"}, "exec"),
        ("process", {"action": "poll", "id": "p"}, None),
        ("process", {"action": "log", "id": "p"}, None),
        ("process", {"action": "list"}, None),
        ("exec", {"command": "true", "action": "write"}, None),
    ],
)
def test_process_actions_that_act_are_governed_by_exec(
    tool: str, params: dict[str, object], governing: str | None
) -> None:
    """`process write|kill` fall under rules on exec; reading a process does not; the tool set is unchanged."""
    assert acting_as(tool, params) == governing
    policy = resolve("tools: {deny: [exec]}")
    assert "exec" not in policy.allowed and "process" in policy.allowed  # the executor refuses its acting actions


def test_also_allow_alone_never_restricts() -> None:
    """also_allow without profile or allow leaves everything in place."""
    assert resolve("tools: {also_allow: [exec]}").allowed == resolve("{}").allowed


def test_also_allow_extends_profile() -> None:
    """Profile minimal plus also_allow read gives exactly those."""
    policy = resolve("tools: {profile: minimal, also_allow: [read]}")
    assert policy.allowed == {"session_status", "read"}


def test_profiles() -> None:
    """Profiles restrict to their members; full restricts nothing."""
    coding = resolve("tools: {profile: coding}").allowed
    assert {"exec", "read", "sessions_spawn", "memory_get"} <= coding
    assert not {"browser", "message", "cron"} & coding
    messaging = resolve("tools: {profile: messaging}").allowed
    assert "message" in messaging and "exec" not in messaging
    assert len(resolve("tools: {profile: full}").allowed) == 21


def test_empty_allow_is_no_restriction() -> None:
    """An explicit empty allow list restricts nothing."""
    assert resolve("tools: {allow: []}").allowed == resolve("{}").allowed


def test_by_provider_model_then_provider() -> None:
    """provider/model and provider layers both apply, most specific first."""
    yaml_text = """
tools:
  by_provider:
    acme: {deny: [web_fetch]}
    acme/tiny-1: {allow: [read, web_search, web_fetch]}
"""
    policy = resolve(yaml_text, provider="ACME", model="tiny-1")
    assert policy.allowed == {"read", "web_search"}
    assert [t.layer.name for t in policy.trace][:3] == [
        "global",
        "provider:acme/tiny-1",
        "provider:acme",
    ]
    assert policy.decision("exec").layer == "provider:acme/tiny-1"
    other = resolve(yaml_text, provider="acme", model="big")
    assert "exec" in other.allowed and "web_fetch" not in other.allowed


def test_sandbox_allow_lifts_default_deny() -> None:
    """Naming browser in sandbox also_allow or allow lifts it from the default deny list."""
    via_also = resolve("tools: {sandbox: {tools: {also_allow: [browser]}}}", session="agent:main:s")
    assert "browser" in via_also.allowed and "exec" in via_also.allowed
    via_allow = resolve("tools: {sandbox: {tools: {allow: [browser, exec]}}}", session="agent:main:s")
    assert via_allow.allowed >= {"browser", "exec"}
    assert "read" not in via_allow.allowed  # an explicit allow replaces the default allow


def test_sandbox_explicit_deny_wins() -> None:
    """An explicit sandbox deny list replaces the default and always wins."""
    policy = resolve(
        "tools: {sandbox: {tools: {also_allow: [browser], deny: [browser, exec]}}}",
        session="agent:main:s",
    )
    assert "browser" not in policy.allowed and "exec" not in policy.allowed
    assert policy.decision("browser").key == "tools.sandbox.tools.deny"
    replaced = resolve("tools: {sandbox: {tools: {also_allow: [canvas], deny: [exec]}}}", session="agent:main:s")
    assert "canvas" in replaced.allowed  # the explicit deny list replaced the default one


def test_agent_sandbox_tools_override_global_per_list() -> None:
    """agents.list[].tools.sandbox.tools overrides the global sandbox lists one by one."""
    policy = resolve(
        """
tools: {sandbox: {tools: {deny: [exec]}}}
agents: {list: [{id: main, tools: {sandbox: {tools: {deny: [read]}}}}]}
""",
        session="agent:main:s",
    )
    assert "exec" in policy.allowed and "read" not in policy.allowed
    assert policy.decision("read").key == "agents.list[0].tools.sandbox.tools.deny"


def test_subagent_fixed_deny_and_leaf_rule() -> None:
    """Sub-agents do not get gateway/cron/sessions_send/session_status by default; at max depth no spawn/list/history."""
    depth1 = resolve("tools: {profile: full}", session="agent:main:subagent:a")
    for tool in (
        "gateway",
        "cron",
        "sessions_send",
        "session_status",
        "sessions_spawn",
        "sessions_list",
        "sessions_history",
    ):
        assert tool not in depth1.allowed, tool
    deeper = resolve("tools: {profile: full, subagents: {max_spawn_depth: 2}}", session="agent:main:subagent:a")
    assert "sessions_spawn" in deeper.allowed
    leaf = resolve(
        "tools: {profile: full, subagents: {max_spawn_depth: 2}}",
        session="agent:main:subagent:a:subagent:b",
    )
    assert "sessions_spawn" not in leaf.allowed
    assert leaf.decision("sessions_spawn").fix == "raise tools.subagents.max_spawn_depth above 2"


def test_implicit_main_agent_and_unknown_agent() -> None:
    """With no agents.list an implicit main exists; an unknown id is a usage error naming ids."""
    assert resolve("{}").agent.id == "main"
    config = load_config_text("agents: {list: [{id: a}, {id: b}]}")
    with pytest.raises(UsageError, match="configured agents: a, b"):
        PolicyResolver(config).resolve(Identity(agent="zz", session="agent:zz:main"))


def test_session_key_of_other_agent_refused() -> None:
    """A session key naming another agent is a usage error."""
    with pytest.raises(UsageError, match="belongs to agent 'other'"):
        resolve("{}", session="agent:other:main")


def test_resolution_is_cached() -> None:
    """The same identity resolves to the same object."""
    resolver = PolicyResolver(load_config_text("{}"))
    ident = Identity(agent="main", session="agent:main:x")
    assert resolver.resolve(ident) is resolver.resolve(ident)


def test_denied_tool_has_fix() -> None:
    """Each denied tool names the key that would change it."""
    policy = resolve("tools: {deny: [group:web]}")
    fix = policy.decision("web_fetch").fix
    assert fix == "remove 'group:web' from tools.deny (it covers 'web_fetch')"


def test_multi_agent_example_locks_family_exec() -> None:
    """The worked multi-agent example denies exec to family by its own deny list."""
    config = load_config(EXAMPLES / "examples" / "multi-agent.yaml")
    policy = PolicyResolver(config).resolve(Identity("family", "agent:family:whatsapp:group:1"))
    decision = policy.decision("exec")
    assert not decision.allowed
    assert (decision.layer, decision.pattern, decision.key) == (
        "agent:family",
        "group:runtime",
        "agents.list[1].tools.deny",
    )
    assert policy.sandbox.sandboxed


@pytest.mark.parametrize("name", ["default.yaml", "examples/single-user.yaml", "examples/subagents.yaml"])
def test_shipped_policies_load(name: str) -> None:
    """Every shipped policy loads and resolves for its default agent."""
    config = load_config(EXAMPLES / name)
    resolver = PolicyResolver(config)
    agent = config.agents.list[0].id if config.agents.list else "main"
    assert resolver.resolve(Identity(agent, f"agent:{agent}:main")).allowed


def test_apply_patch_hyphen_is_an_alias() -> None:
    """`apply-patch` (OpenClaw's spelling) names apply_patch in lists, like `bash` names exec."""
    from sandbox.policy.groups import normalize_name

    assert normalize_name("apply-patch") == "apply_patch" and normalize_name("BASH") == "exec"
