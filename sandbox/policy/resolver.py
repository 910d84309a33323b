"""The layered resolver: (agent, session, provider/model) -> the tools that exist, and why."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from sandbox.config.merge import EffectiveAgent, agent_ids, effective_agent
from sandbox.config.models import Config, ToolLists
from sandbox.errors import UsageError
from sandbox.policy.groups import (
    BUILTIN_TOOLS,
    DEFAULT_SANDBOX_ALLOW,
    DEFAULT_SANDBOX_DENY,
    SUBAGENT_ALWAYS_DENY,
    SUBAGENT_LEAF_DENY,
    explicitly_named,
)
from sandbox.policy.layers import (
    Decision,
    Layer,
    Rule,
    apply_layer,
    compile_rule,
    first_refusal,
    list_layer,
)
from sandbox.policy.sessions import SessionKey, parse_session_key

# Resolutions kept per identity (one per session key: a long-running service sees unbounded
# many), least recently used first out; the tool sets they share are kept per layer stack.
MAX_CACHED_IDENTITIES = 16_384
MAX_CACHED_OUTCOMES = 4096

# (trace, decisions, allowed): what a stack of layers leaves, the same for every session on it
Outcome = tuple[tuple["LayerTrace", ...], tuple[Decision, ...], frozenset[str]]


@dataclass(frozen=True)
class Identity:
    """Who is asking: the inputs of one resolution (also the cache key)."""

    agent: str
    session: str
    provider: str | None = None
    model: str | None = None
    # a spawned session's `sessions_spawn {tools}`: one more layer that can only narrow
    narrow: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SandboxStatus:
    """Whether a session runs sandboxed, and why."""

    sandboxed: bool
    mode: str
    scope: str
    workspace_access: str
    reason: str


@dataclass(frozen=True)
class LayerTrace:
    """The tool set left after one layer (for explain and for the subset property)."""

    layer: Layer
    remaining: frozenset[str]


@dataclass(frozen=True)
class ResolvedPolicy:
    """The effective tool set for one identity, with a decision per known tool."""

    identity: Identity
    session: SessionKey
    agent: EffectiveAgent
    sandbox: SandboxStatus
    trace: tuple[LayerTrace, ...]
    decisions: tuple[Decision, ...]
    allowed: frozenset[str]

    def decision(self, tool: str) -> Decision:
        """The decision for one tool (KeyError if unknown)."""
        for item in self.decisions:
            if item.tool == tool:
                return item
        raise KeyError(tool)


def sandbox_status(agent: EffectiveAgent, session: SessionKey) -> SandboxStatus:
    """Apply the agent's sandbox mode to a session key."""
    cfg = agent.sandbox
    main = agent.main_session_key
    if cfg.mode == "off":
        sandboxed, reason = False, "mode off: every session runs on the host"
    elif cfg.mode == "all":
        sandboxed, reason = True, "mode all: every session is sandboxed"
    elif session.is_main:
        sandboxed, reason = False, f"mode non-main: {session.raw!r} is the agent's main session"
    else:
        sandboxed, reason = True, f"mode non-main: {session.raw!r} is not the main session {main!r}"
    return SandboxStatus(sandboxed, cfg.mode, cfg.scope, cfg.workspace_access, reason)


class PolicyResolver:
    """Resolves effective tool sets; compiled layers and results are cached (bounded, LRU).

    Args:
        config: a loaded config (immutable, so caching on it is safe).
        extra_tools: tool names beyond the built-ins (skills), part of the universe.
        max_identities: resolutions kept, one per identity (session), least recently used out.
    """

    def __init__(
        self, config: Config, extra_tools: tuple[str, ...] = (), *, max_identities: int = MAX_CACHED_IDENTITIES
    ) -> None:
        self.config = config
        self.universe: tuple[str, ...] = BUILTIN_TOOLS + tuple(t for t in extra_tools if t not in BUILTIN_TOOLS)
        self._agents: dict[str, EffectiveAgent] = {}
        self._static: dict[str, tuple[Layer, ...]] = {}
        self._max_identities = max_identities
        self._cache: OrderedDict[Identity, ResolvedPolicy] = OrderedDict()
        self._outcomes: OrderedDict[tuple[str, ...], Outcome] = OrderedDict()
        self._global = self._lists_layer("global", "tools", config.tools)
        # for agents with their own profile: the agent's profile replaces the global one, global
        # allow / deny still apply (OpenClaw's tools.profile semantics)
        self._global_unprofiled = list_layer(
            "global",
            key_prefix="tools",
            profile=None,
            allow=config.tools.allow,
            also_allow=config.tools.also_allow,
            deny=config.tools.deny,
            universe=self.universe,
        )
        self._providers = {
            key.lower(): self._lists_layer(f"provider:{key}", f"tools.by_provider[{key!r}]", lists)
            for key, lists in config.tools.by_provider.items()
        }

    def agent(self, agent_id: str) -> EffectiveAgent:
        """The merged agent, or UsageError naming the known ids."""
        found = self._agents.get(agent_id)
        if found is None:
            try:
                found = effective_agent(self.config, agent_id)
            except KeyError:
                known = ", ".join(agent_ids(self.config))
                raise UsageError(f"unknown agent {agent_id!r}; configured agents: {known}") from None
            self._agents[agent_id] = found
        return found

    def resolve(self, identity: Identity) -> ResolvedPolicy:
        """The effective policy for `identity` (cached)."""
        cached = self._cache.get(identity)
        if cached is not None:
            self._cache.move_to_end(identity)
            return cached
        result = self._resolve(identity)
        self._cache[identity] = result
        if len(self._cache) > self._max_identities:
            self._cache.popitem(last=False)
        return result

    def forget(self, identity: Identity) -> None:
        """Drop one identity's cached resolution (its session ended); resolving again is exact."""
        self._cache.pop(identity, None)

    def _resolve(self, identity: Identity) -> ResolvedPolicy:
        agent = self.agent(identity.agent)
        session = parse_session_key(identity.session, agent.id)
        status = sandbox_status(agent, session)
        providers = self._provider_layers(identity)
        glob = self._global_unprofiled if agent.tools.profile is not None else self._global
        floor = self._tenant_layer(agent.tenant)
        layers = [glob, *([floor] if floor else []), *providers, self._agent_layer(agent)]
        if status.sandboxed:
            layers.append(self._sandbox_layer(agent))
        if session.spawn_depth > 0:
            layers.append(self._subagent_layer(session.spawn_depth))
        if identity.narrow is not None:
            layers.append(
                list_layer(
                    "spawn",
                    key_prefix="sessions_spawn.tools",
                    profile=None,
                    allow=list(identity.narrow),
                    also_allow=None,
                    deny=None,
                    universe=self.universe,
                )
            )
        # what picks the layers: sessions that agree on it share one outcome
        narrow = ("narrow", *identity.narrow) if identity.narrow is not None else ()
        key = (agent.id, str(status.sandboxed), str(session.spawn_depth), *(p.name for p in providers), *narrow)
        trace, decisions, remaining = self._outcome(key, layers)
        return ResolvedPolicy(identity, session, agent, status, trace, decisions, remaining)

    def _outcome(self, key: tuple[str, ...], layers: list[Layer]) -> Outcome:
        found = self._outcomes.get(key)
        if found is not None:
            self._outcomes.move_to_end(key)
            return found
        remaining = frozenset(self.universe)
        trace = []
        for layer in layers:
            remaining = apply_layer(layer, remaining)
            trace.append(LayerTrace(layer, remaining))
        decisions = tuple(self._decide(tool, layers) for tool in self.universe)
        found = (tuple(trace), decisions, remaining)
        self._outcomes[key] = found
        if len(self._outcomes) > MAX_CACHED_OUTCOMES:
            self._outcomes.popitem(last=False)
        return found

    @staticmethod
    def _decide(tool: str, layers: list[Layer]) -> Decision:
        granted: Decision | None = None
        for layer in layers:
            refused = first_refusal(layer, tool)
            if refused is not None:
                return refused  # no later layer can bring it back
            for rule in layer.restrictions:
                granted = Decision(tool, True, layer.name, rule.kind, rule.members[tool], rule.key, None)
        return granted or Decision(tool, True, None, None, None, None, None)

    def _lists_layer(self, name: str, key: str, lists: ToolLists) -> Layer:
        return list_layer(
            name,
            key_prefix=key,
            profile=getattr(lists, "profile", None),
            allow=lists.allow,
            also_allow=lists.also_allow,
            deny=lists.deny,
            universe=self.universe,
        )

    def _provider_layers(self, identity: Identity) -> list[Layer]:
        if not identity.provider:
            return []
        provider = identity.provider.lower()
        keys = [f"{provider}/{identity.model.lower()}"] if identity.model else []
        keys.append(provider)
        return [self._providers[k] for k in keys if k in self._providers]

    def _agent_layer(self, agent: EffectiveAgent) -> Layer:
        cached = self._static.get(f"agent:{agent.id}")
        if cached is None:
            cached = (self._lists_layer(f"agent:{agent.id}", f"{agent.key_path}.tools", agent.tools),)
            self._static[f"agent:{agent.id}"] = cached
        return cached[0]

    def _sandbox_layer(self, agent: EffectiveAgent) -> Layer:
        cache_key = f"sandbox:{agent.id}"
        cached = self._static.get(cache_key)
        if cached is not None:
            return cached[0]
        layer = self._build_sandbox_layer(agent)
        self._static[cache_key] = (layer,)
        return layer

    def _build_sandbox_layer(self, agent: EffectiveAgent) -> Layer:
        # Each list falls back agent -> global -> built-in default, independently.
        own = agent.tools.sandbox.tools if agent.tools.sandbox else None
        glob = self.config.tools.sandbox.tools
        agent_key = f"{agent.key_path}.tools.sandbox.tools"

        def pick(attr: str) -> tuple[list[str] | None, str]:
            if own is not None and getattr(own, attr) is not None:
                return getattr(own, attr), f"{agent_key}.{attr}"
            if getattr(glob, attr) is not None:
                return getattr(glob, attr), f"tools.sandbox.tools.{attr}"
            return None, ""

        allow, allow_key = pick("allow")
        also, also_key = pick("also_allow")
        deny, deny_key = pick("deny")
        fix_hint = f"{agent_key if own is not None else 'tools.sandbox.tools'}.also_allow"
        restrictions: tuple[Rule, ...]
        if allow is None:
            restrictions = (
                compile_rule(
                    "allow",
                    "(default sandbox allow list)" + (f" + {also_key}" if also else ""),
                    [*DEFAULT_SANDBOX_ALLOW, *(also or [])],
                    self.universe,
                    default=True,
                ),
            )
        elif allow:
            restrictions = (compile_rule("allow", allow_key, [*allow, *(also or [])], self.universe),)
        else:
            restrictions = ()  # explicit empty allow: no restriction from this layer
        denies: tuple[Rule, ...] = ()
        if deny is None:
            named = {t for rule in restrictions for t in rule.members if not rule.default}
            named |= set(compile_rule("allow", "", also or [], self.universe).members)
            default_deny = compile_rule(
                "deny",
                "(default sandbox deny list)",
                DEFAULT_SANDBOX_DENY,
                self.universe,
                default=True,
            )
            lifted = {t: p for t, p in default_deny.members.items() if t not in named}
            denies = (Rule("deny", default_deny.key, default_deny.patterns, lifted, default=True),)
        elif deny:
            denies = (compile_rule("deny", deny_key, deny, self.universe),)
        return Layer("sandbox", restrictions, denies, fix_hint=fix_hint)

    def _tenant_layer(self, tenant: str) -> Layer | None:
        """The tenant floor (`tenants[i].tools`): narrows every agent of the tenant, after global."""
        cache_key = f"tenant:{tenant}"
        cached = self._static.get(cache_key)
        if cached is not None:
            return cached[0] if cached else None
        found = next(((i, t) for i, t in enumerate(self.config.tenants) if t.id == tenant), None)
        layer = None
        if found is not None and (found[1].tools.allow or found[1].tools.also_allow or found[1].tools.deny):
            index, declared = found
            layer = list_layer(
                "tenant",
                key_prefix=f"tenants[{index}].tools",
                profile=None,
                allow=declared.tools.allow,
                also_allow=declared.tools.also_allow,
                deny=declared.tools.deny,
                universe=self.universe,
            )
        self._static[cache_key] = (layer,) if layer is not None else ()
        return layer

    def _subagent_layer(self, depth: int) -> Layer:
        cache_key = f"subagent:{depth}"
        cached = self._static.get(cache_key)
        if cached is not None:
            return cached[0]
        section = self.config.tools.subagents
        lists = section.tools
        base = list_layer(
            "subagent",
            key_prefix="tools.subagents.tools",
            profile=None,
            allow=lists.allow,
            also_allow=lists.also_allow,
            deny=lists.deny,
            universe=self.universe,
        )
        fixed = compile_rule("deny", "(fixed sub-agent deny list)", SUBAGENT_ALWAYS_DENY, self.universe)
        # explicit configuration wins over the fixed list (OpenClaw): a tool named in allow or
        # also_allow is lifted from it; `deny` still wins over both (base.denies)
        named = explicitly_named([*(lists.allow or []), *(lists.also_allow or [])], self.universe)
        lifted = {t: p for t, p in fixed.members.items() if t not in named}
        always = Rule("deny", fixed.key, fixed.patterns, lifted, default=True)
        denies = (*base.denies, always)
        if depth >= section.max_spawn_depth:
            leaf = compile_rule(
                "deny",
                f"(leaf rule: spawn depth {depth} >= tools.subagents.max_spawn_depth)",
                SUBAGENT_LEAF_DENY,
                self.universe,
                fixed_fix=f"raise tools.subagents.max_spawn_depth above {depth}",
            )
            denies = (*denies, leaf)
        layer = Layer("subagent", base.restrictions, denies, fix_hint=base.fix_hint)
        self._static[cache_key] = (layer,)
        return layer
