"""Property tests over random policy stacks: narrowing, deny wins, groups, provenance."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.config import load_config_text
from sandbox.policy import Identity, PolicyResolver, ResolvedPolicy
from sandbox.policy.groups import BUILTIN_TOOLS, GROUPS, PROFILES, expand, expand_all

PATTERNS = [*BUILTIN_TOOLS, *GROUPS, "web_*", "sessions_*", "*_get", "BASH", "Exec", "*"]
pattern_lists = st.lists(st.sampled_from(PATTERNS), max_size=6)
optional_list = st.none() | pattern_lists
profiles = st.none() | st.sampled_from(["minimal", "coding", "messaging", "full"])


@st.composite
def lists(draw: Any, with_profile: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("allow", "also_allow", "deny"):
        value = draw(optional_list)
        if value is not None:
            out[key] = value
    if with_profile and (profile := draw(profiles)):
        out["profile"] = profile
    return out


@st.composite
def scenarios(draw: Any) -> tuple[dict[str, Any], Identity]:
    config = {
        "tools": {
            **draw(lists()),
            "by_provider": {"acme": draw(lists()), "acme/m1": draw(lists())},
            "sandbox": {"tools": draw(lists(with_profile=False))},
            "subagents": {
                "tools": draw(lists(with_profile=False)),
                "max_spawn_depth": draw(st.integers(1, 3)),
            },
        },
        "agents": {
            "defaults": {"sandbox": {"mode": draw(st.sampled_from(["off", "non-main", "all"]))}},
            "list": [{"id": "a", "tools": draw(lists())}],
        },
    }
    session = draw(
        st.sampled_from(["agent:a:main", "agent:a:chat", "agent:a:subagent:x", "agent:a:subagent:x:subagent:y"])
    )
    provider = draw(st.sampled_from([None, "acme", "other"]))
    model = draw(st.sampled_from([None, "m1", "m2"]))
    return config, Identity("a", session, provider, model)


def _resolve(config: dict[str, Any], identity: Identity) -> ResolvedPolicy:
    return PolicyResolver(load_config_text(yaml.safe_dump(config))).resolve(identity)


SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_each_layer_only_narrows(scenario: tuple[dict[str, Any], Identity]) -> None:
    """The set left after layer k+1 is a subset of the set after layer k.

    A profile is not a layer of its own: it restricts within the layer that holds it (the agent's
    layer when the agent has one, which then replaces the global profile; else the global layer)."""
    policy = _resolve(*scenario)
    previous = frozenset(BUILTIN_TOOLS)
    for step in policy.trace:
        assert step.remaining <= previous
        previous = step.remaining
    assert policy.allowed == previous


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_deny_always_wins(scenario: tuple[dict[str, Any], Identity]) -> None:
    """A tool named by any applied deny list is never allowed."""
    config, identity = scenario
    policy = _resolve(config, identity)
    for step in policy.trace:
        for rule in step.layer.denies:
            assert not (set(rule.members) & policy.allowed)
    global_deny = expand_all(config["tools"].get("deny", []), BUILTIN_TOOLS)
    agent_deny = expand_all(config["agents"]["list"][0]["tools"].get("deny", []), BUILTIN_TOOLS)
    assert not ((global_deny | agent_deny) & policy.allowed)


@given(st.sampled_from(sorted(GROUPS)))
def test_group_expansion_is_union_of_members(group: str) -> None:
    """A group names exactly the union of its members (plus apply_patch after write)."""
    members = expand_all(GROUPS[group], BUILTIN_TOOLS)
    assert expand(group, BUILTIN_TOOLS) == members


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_provenance_names_a_layer_that_holds_the_pattern(
    scenario: tuple[dict[str, Any], Identity],
) -> None:
    """Every decision's pattern is in a list of the layer it names, and that pattern covers the tool."""
    policy = _resolve(*scenario)
    layers = {step.layer.name: step.layer for step in policy.trace}
    for decision in policy.decisions:
        if decision.layer is None:
            assert decision.allowed and decision.pattern is None
            continue
        layer = layers[decision.layer]
        rules = [*layer.restrictions, *layer.denies]
        matching = [r for r in rules if r.key == decision.key]
        assert matching, (decision, rules)
        if decision.pattern is not None:
            rule = matching[0]
            assert decision.pattern in rule.patterns
            assert decision.tool in expand(decision.pattern, BUILTIN_TOOLS)
        if not decision.allowed:
            index = [s.layer.name for s in policy.trace].index(decision.layer)
            before = policy.trace[index - 1].remaining if index else frozenset(BUILTIN_TOOLS)
            assert decision.tool in before and decision.tool not in policy.trace[index].remaining


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_agent_profile_replaces_the_global_profile(scenario: tuple[dict[str, Any], Identity]) -> None:
    """With an agent profile the global profile changes nothing; without one it bounds the result."""
    config, identity = scenario
    policy = _resolve(config, identity)
    agent_tools = config["agents"]["list"][0]["tools"]
    glob = config["tools"]
    if "profile" in agent_tools:
        without = copy.deepcopy(config)
        without["tools"].pop("profile", None)
        assert _resolve(without, identity).allowed == policy.allowed
    elif (members := PROFILES.get(glob.get("profile", "full"))) is not None:
        base = expand_all([*members, *glob.get("also_allow", [])], BUILTIN_TOOLS)
        assert policy.allowed <= base
