"""The policy layers: each one a small named step that can only narrow the tool set."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sandbox.policy.groups import PROFILES, expand, normalize_name

ListKind = Literal["profile", "allow", "deny"]


@dataclass(frozen=True)
class Rule:
    """One list of one layer, compiled: which tools it names, and by which pattern."""

    kind: ListKind
    key: str  # the config key that holds the list, or a "(default ...)" description
    patterns: tuple[str, ...]
    members: dict[str, str] = field(hash=False, compare=False)  # tool -> first pattern naming it
    default: bool = False  # a built-in default, not written in the config
    fixed_fix: str | None = None  # for built-in rules no config key can lift


def compile_rule(
    kind: ListKind,
    key: str,
    patterns: Iterable[str],
    universe: Sequence[str],
    *,
    default: bool = False,
    fixed_fix: str | None = None,
) -> Rule:
    """Expand the patterns of one list over `universe`, keeping the first pattern per tool."""
    pats = tuple(patterns)
    members: dict[str, str] = {}
    for pattern in pats:
        for tool in sorted(expand(pattern, universe)):
            # an exact name is the clearest provenance; otherwise the first pattern wins
            if tool not in members or normalize_name(pattern) == tool:
                members[tool] = pattern
    return Rule(kind, key, pats, members, default=default, fixed_fix=fixed_fix)


@dataclass(frozen=True)
class Layer:
    """A named step: restrictions (a tool must be in each) and one deny list (deny wins)."""

    name: str
    restrictions: tuple[Rule, ...]
    denies: tuple[Rule, ...]
    fix_hint: str  # where a user would add an allow for this layer


@dataclass(frozen=True)
class Decision:
    """Why a tool is or is not available, with the layer, list and pattern that decided."""

    tool: str
    allowed: bool
    layer: str | None
    kind: str | None
    pattern: str | None
    key: str | None
    fix: str | None


def list_layer(
    name: str,
    *,
    key_prefix: str,
    profile: str | None,
    allow: Sequence[str] | None,
    also_allow: Sequence[str] | None,
    deny: Sequence[str] | None,
    universe: Sequence[str],
) -> Layer:
    """Build a layer from a profile and allow / also_allow / deny lists.

    `also_allow` extends whatever the layer restricts to; alone it restricts nothing.
    """
    extra = list(also_allow or [])
    restrictions: list[Rule] = []
    members = PROFILES.get(profile) if profile else None
    if members is not None:
        restrictions.append(compile_rule("profile", f"{key_prefix}.profile={profile}", [*members, *extra], universe))
    if allow:
        restrictions.append(compile_rule("allow", f"{key_prefix}.allow", [*allow, *extra], universe))
    denies = (compile_rule("deny", f"{key_prefix}.deny", deny, universe),) if deny else ()
    return Layer(name, tuple(restrictions), denies, fix_hint=f"{key_prefix}.also_allow")


def apply_layer(layer: Layer, current: frozenset[str]) -> frozenset[str]:
    """The tools that survive `layer`, given those that survived the layers before it."""
    out = set(current)
    for rule in layer.restrictions:
        out &= rule.members.keys()
    for rule in layer.denies:
        out -= rule.members.keys()
    return frozenset(out)


def first_refusal(layer: Layer, tool: str) -> Decision | None:
    """The rule of `layer` that removes `tool`, as a Decision, or None if it survives."""
    for deny in layer.denies:
        if tool in deny.members:
            pattern = deny.members[tool]
            return Decision(tool, False, layer.name, "deny", pattern, deny.key, _deny_fix(layer, deny, tool))
    for rule in layer.restrictions:
        if tool not in rule.members:
            return Decision(tool, False, layer.name, rule.kind, None, rule.key, _allow_fix(layer, rule, tool))
    return None


def _deny_fix(layer: Layer, rule: Rule, tool: str) -> str:
    key, pattern = rule.key, rule.members[tool]
    if rule.fixed_fix is not None:
        return rule.fixed_fix
    if rule.default:
        return f"name {tool!r} in {layer.fix_hint} to lift it from the {rule.key.strip('()')}"
    if pattern.lower() == tool:
        return f"remove {pattern!r} from {key}"
    return f"remove {pattern!r} from {key} (it covers {tool!r})"


def _allow_fix(layer: Layer, rule: Rule, tool: str) -> str:
    if rule.kind == "profile":
        return f"add {tool!r} to {layer.fix_hint} or choose another profile"
    if rule.default:
        return f"add {tool!r} to {layer.fix_hint}"
    return f"add {tool!r} to {rule.key}"
