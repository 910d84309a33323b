"""The effective, merged view of one agent: defaults overridden key by key, binds concatenated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from sandbox.config.models import AgentConfig, AgentToolsConfig, Config, SandboxConfig
from sandbox.errors import UsageError

M = TypeVar("M", bound=BaseModel)


def merge_models(base: M, override: M) -> M:
    """Return `base` with every key that `override` sets explicitly replacing it.

    Nested models merge recursively; `docker.binds` concatenates (defaults first).
    """
    update: dict[str, Any] = {}
    for name in override.model_fields_set:
        new = getattr(override, name)
        old = getattr(base, name)
        if isinstance(new, BaseModel) and isinstance(old, BaseModel):
            update[name] = merge_models(old, new)
        elif name == "binds" and isinstance(old, list):
            update[name] = [*old, *new]
        else:
            update[name] = new
    return base.model_copy(update=update)


@dataclass(frozen=True)
class EffectiveAgent:
    """One agent as the runtime and the policy see it."""

    id: str
    index: int | None  # position in agents.list, None for the implicit `main`
    tenant: str
    workspace: Path
    tools: AgentToolsConfig
    sandbox: SandboxConfig
    # a spawned session's view of its parent's workspace: (host folder, read_only), see sessions/
    parent_view: tuple[str, bool] | None = None
    # the tenant's egress allowlist (tenants[].egress.allow); None: the tenant sets none
    egress_floor: tuple[str, ...] | None = None

    @property
    def main_session_key(self) -> str:
        """The key of this agent's main session (`agent:<id>:main`)."""
        return f"agent:{self.id}:main"

    @property
    def key_path(self) -> str:
        """Where this agent lives in the config, for messages."""
        return "agents.defaults" if self.index is None else f"agents.list[{self.index}]"


def agent_ids(config: Config) -> list[str]:
    """Configured agent ids; the implicit `main` when the list is empty."""
    return [agent.id for agent in config.agents.list] or ["main"]


def default_agent_id(config: Config, tenant: str | None = None) -> str:
    """The agent a call that names none runs as.

    With `tenant` (the service, MCP): that tenant's agent marked `default: true`, else its only
    agent. Without (the library and the CLI, which act for no tenant in particular): the one
    agent marked `default: true` when only one is (several tenants marking one each: tenant
    `default`'s), else the only agent. The implicit `main` when no agent is configured.

    Raises:
        UsageError: no agent, or several and none of them the default (the error lists them).
    """
    listed = [a for a in config.agents.list if tenant is None or a.tenant == tenant]
    if not config.agents.list and tenant in (None, "default"):
        return "main"
    flagged = [a for a in listed if a.default]
    if len(flagged) > 1:  # only without a tenant: the loader allows one per tenant
        flagged = [a for a in flagged if a.tenant == "default"]
    if flagged:
        return flagged[0].id
    if len(listed) == 1:
        return listed[0].id
    whose = "the config" if tenant is None else f"tenant {tenant!r}"
    if not listed:
        raise UsageError(f"{whose} has no agents", tenant=tenant)
    marked = [f"{a.id} (tenant {a.tenant})" for a in config.agents.list if a.default]
    why = f"the defaults are per tenant: {', '.join(marked)}" if marked else "none is `default: true`"
    raise UsageError(
        f"name the agent: {whose} has {len(listed)} agents ({', '.join(a.id for a in listed)}) and {why}",
        tenant=tenant,
        agents=[a.id for a in listed],
    )


def probe_agent_id(config: Config) -> str:
    """An agent that stands for the config where one is needed but none is asked for (the image
    `doctor` and `/readyz` check): the default agent when there is one, else the first. Never
    raises."""
    flagged = [a for a in config.agents.list if a.default]
    home = [a for a in flagged if a.tenant == "default"]
    return (home or flagged or config.agents.list or [AgentConfig(id="main")])[0].id


def effective_agent(config: Config, agent_id: str) -> EffectiveAgent:
    """Merge `agents.defaults` with the agent's own settings.

    Raises:
        KeyError: the agent id is not configured.
    """
    defaults = config.agents.defaults
    if not config.agents.list and agent_id == "main":
        agent, index = AgentConfig(id="main"), None
    else:
        found = [(i, a) for i, a in enumerate(config.agents.list) if a.id == agent_id]
        if not found:
            raise KeyError(agent_id)
        index, agent = found[0]
    workspace = agent.workspace or defaults.workspace or (config.state_dir / "workspaces" / agent.id)
    sandbox = merge_models(defaults.sandbox, agent.sandbox)
    if sandbox.workspace_root is None:
        sandbox = sandbox.model_copy(update={"workspace_root": config.state_dir / "sandboxes"})
    floor = next((t.egress.allow for t in config.tenants if t.id == agent.tenant), None)
    return EffectiveAgent(
        id=agent.id,
        index=index,
        tenant=agent.tenant,
        workspace=workspace,
        tools=agent.tools,
        sandbox=sandbox,
        egress_floor=tuple(floor) if floor is not None else None,
    )
