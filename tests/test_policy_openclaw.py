"""Table tests for where the policy follows OpenClaw, and where it is deliberately stricter."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.config import load_config_text
from sandbox.errors import SandboxError
from sandbox.policy import Identity, PolicyResolver, ResolvedPolicy

SUB = "agent:main:subagent:a"
# sub-agent sessions are sandboxed under non-main; mode off keeps the sandbox layer out of these tables
OFF = "\nagents: {defaults: {sandbox: {mode: 'off'}}}"


def resolve(yaml_text: str, session: str = "agent:main:main") -> ResolvedPolicy:
    config = load_config_text(yaml_text, base_dir=Path("/tmp"))
    return PolicyResolver(config).resolve(Identity(agent="main", session=session))


def agent(tools: str, glob: str = "") -> str:
    return f"tools: {{{glob}}}\nagents: {{list: [{{id: main, tools: {{{tools}}}}}]}}"


@pytest.mark.parametrize(
    ("yaml_text", "denied", "layer", "key"),
    [
        ("tools: {deny: [apply-patch]}", "apply_patch", "global", "tools.deny"),
        ("tools: {deny: [Apply-Patch]}", "apply_patch", "global", "tools.deny"),
        (agent("deny: [apply-patch]"), "apply_patch", "agent:main", "agents.list[0].tools.deny"),
        ("tools: {allow: [read, apply-patch]}", "write", "global", "tools.allow"),
    ],
)
def test_apply_patch_hyphen_alias(yaml_text: str, denied: str, layer: str, key: str) -> None:
    """`apply-patch` names apply_patch in any list, like `bash` names exec."""
    policy = resolve(yaml_text)
    decision = policy.decision(denied)
    assert not decision.allowed and (decision.layer, decision.key) == (layer, key)
    if "allow" in key:
        assert {"read", "apply_patch"} <= policy.allowed


@pytest.mark.parametrize(
    ("yaml_text", "allowed", "denied", "deciding"),
    [
        # the agent's profile replaces the global one: coding gives exec although global is minimal
        (
            agent("profile: coding", "profile: minimal"),
            {"exec", "read", "memory_get", "session_status"},
            {"message": ("agent:main", "agents.list[0].tools.profile=coding")},
            {"exec": ("agent:main", "agents.list[0].tools.profile=coding")},
        ),
        # full as the agent's profile lifts the global profile entirely
        (
            agent("profile: full", "profile: minimal"),
            {"exec", "browser", "message"},
            {},
            {"exec": (None, None)},
        ),
        # ...and the other way: a narrower agent profile is its base set, not an extra layer
        (
            agent("profile: messaging", "profile: coding"),
            {"message", "sessions_send"},
            {"exec": ("agent:main", "agents.list[0].tools.profile=messaging")},
            {"message": ("agent:main", "agents.list[0].tools.profile=messaging")},
        ),
        # global allow and deny still apply under the agent's profile
        (
            agent("profile: coding", "profile: minimal, deny: [exec]"),
            {"read"},
            {"exec": ("global", "tools.deny")},
            {},
        ),
        (
            agent("profile: full", "profile: minimal, allow: [read, exec, browser]"),
            {"read", "exec", "browser"},
            {"write": ("global", "tools.allow")},
            {"browser": ("global", "tools.allow")},
        ),
        # without an agent profile the global one is the base set
        (
            agent("deny: [read]", "profile: minimal, also_allow: [read, exec]"),
            {"session_status", "exec"},
            {"read": ("agent:main", "agents.list[0].tools.deny"), "write": ("global", "tools.profile=minimal")},
            {"exec": ("global", "tools.profile=minimal")},
        ),
    ],
)
def test_agent_profile_replaces_global_profile(
    yaml_text: str,
    allowed: set[str],
    denied: dict[str, tuple[str, str]],
    deciding: dict[str, tuple[str | None, str | None]],
) -> None:
    """An agent's tools.profile is its base set in place of tools.profile; explain names the deciding key."""
    policy = resolve(yaml_text)
    assert allowed <= policy.allowed
    for tool, (layer, key) in denied.items():
        decision = policy.decision(tool)
        assert not decision.allowed and (decision.layer, decision.key) == (layer, key), decision
    for tool, (allowing_layer, allowing_key) in deciding.items():
        decision = policy.decision(tool)
        assert decision.allowed and (decision.layer, decision.key) == (allowing_layer, allowing_key), decision


def test_replaced_global_profile_leaves_no_trace_in_the_global_layer() -> None:
    """With an agent profile, the global layer holds only the global allow / deny lists."""
    policy = resolve(agent("profile: coding", "profile: minimal, deny: [cron]"))
    glob = policy.trace[0].layer
    assert glob.name == "global" and glob.restrictions == ()
    assert [r.key for r in glob.denies] == ["tools.deny"]


@pytest.mark.parametrize(
    ("subagents", "allowed", "denied"),
    [
        # the fixed list: gateway, cron, sessions_send and session_status
        ("{}", set(), {"gateway", "cron", "sessions_send", "session_status"}),
        # also_allow names lift them; the rest of the fixed list stays
        ("{tools: {also_allow: [session_status, cron]}}", {"session_status", "cron"}, {"gateway", "sessions_send"}),
        # allow names lift them too (and restrict the sub-agent to the list, as any allow does)
        ("{tools: {allow: [read, gateway]}}", {"read", "gateway"}, {"cron", "exec", "session_status"}),
        # a group names its members explicitly
        ("{tools: {also_allow: [group:automation]}}", {"cron", "gateway"}, {"sessions_send"}),
        # a wildcard is not an explicit name: it lifts nothing
        ("{tools: {allow: ['*']}}", {"exec"}, {"gateway", "cron", "sessions_send", "session_status"}),
        # deny wins over allow and also_allow
        (
            "{tools: {allow: [gateway, read], also_allow: [cron], deny: [gateway, cron]}}",
            {"read"},
            {"gateway", "cron"},
        ),
    ],
)
def test_subagent_allow_lifts_the_fixed_deny_list(subagents: str, allowed: set[str], denied: set[str]) -> None:
    """Naming a fixed-denied tool in the sub-agent allow / also_allow lifts it; deny still wins."""
    policy = resolve(f"tools: {{profile: full, subagents: {subagents}}}" + OFF, session=SUB)
    assert allowed <= policy.allowed
    for tool in denied:
        decision = policy.decision(tool)
        assert not decision.allowed and decision.layer == "subagent", (tool, decision)


def test_fixed_subagent_denial_says_how_to_lift_it() -> None:
    """The fixed list's refusal names the key that lifts it; a configured deny names its own key."""
    status = resolve("tools: {profile: full}" + OFF, session=SUB).decision("session_status")
    assert status.key == "(fixed sub-agent deny list)"
    assert status.fix == (
        "name 'session_status' in tools.subagents.tools.also_allow to lift it from the fixed sub-agent deny list"
    )
    denied = resolve("tools: {subagents: {tools: {also_allow: [cron], deny: [cron]}}}" + OFF, session=SUB).decision(
        "cron"
    )
    assert (denied.key, denied.fix) == ("tools.subagents.tools.deny", "remove 'cron' from tools.subagents.tools.deny")


def test_main_session_keeps_session_status() -> None:
    """The sub-agent list applies only to spawned sessions."""
    assert "session_status" in resolve("tools: {profile: full}").allowed


@pytest.mark.parametrize("where", ["tools: {profile: nope}", agent("profile: codeing")])
def test_unknown_profile_is_a_config_error(where: str) -> None:
    """Stricter than OpenClaw (which ignores it): an unknown profile name fails the load."""
    with pytest.raises(SandboxError, match="profile"):
        load_config_text(where, base_dir=Path("/tmp"))


def test_sandboxed_subagent_gets_a_lifted_tool_the_sandbox_allows() -> None:
    """Under non-main a sub-agent is sandboxed too; lifting session_status works there (the sandbox allows it)."""
    policy = resolve("tools: {subagents: {tools: {also_allow: [session_status]}}}", session=SUB)
    assert policy.sandbox.sandboxed and "session_status" in policy.allowed
    assert "gateway" not in policy.allowed
