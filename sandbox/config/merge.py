"""The effective, merged view of one agent: defaults overridden key by key, binds concatenated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from sandbox.config.models import AgentConfig, AgentToolsConfig, Config, SandboxConfig

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


def default_agent_id(config: Config) -> str:
    """The agent marked `default: true`, else the first, else `main`."""
    for agent in config.agents.list:
        if agent.default:
            return agent.id
    return agent_ids(config)[0]


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
