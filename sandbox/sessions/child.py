"""What a spawned session is, wherever it is looked at: its lineage and the agent it runs as."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.config.merge import EffectiveAgent
from sandbox.config.models import Config

if TYPE_CHECKING:  # sqlite3 loads only where something was spawned (explain stays light)
    from sandbox.sessions.registry import Child

REGISTRY_FILE = "sessions.sqlite3"


def lineage_of(state_dir: Path, key: str) -> Child | None:
    """The lineage of `key` from the state dir's registry; None when nothing was ever spawned."""
    path = state_dir / REGISTRY_FILE
    if not path.exists():
        return None
    from sandbox.sessions.registry import Registry  # sqlite3: only once something was spawned

    registry = Registry(path)
    try:
        return registry.child(key)
    finally:
        registry.close()


def child_agent(config: Config, agent: EffectiveAgent, child: Child) -> EffectiveAgent:
    """The agent as a spawned session runs it: its own sandbox, its parent's workspace at /parent."""
    sandbox = agent.sandbox
    if config.tools.subagents.sandbox_scope == "session":
        sandbox = sandbox.model_copy(update={"scope": "session", "workspace_access": "none"})
    view = (child.parent_source, child.parent_view == "ro") if child.parent_view != "none" else None
    if sandbox.scope != "session":
        # a child in its agent's shared container already works in that workspace; a mount of
        # its own would give the shared container a second spec (and recreate it under the parent)
        view = None
    return dataclasses.replace(agent, sandbox=sandbox, parent_view=view)
