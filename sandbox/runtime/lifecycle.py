"""Listing, recreating and pruning sandboxes: the operations behind the lifecycle CLI."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sandbox.config.merge import EffectiveAgent, agent_ids, effective_agent
from sandbox.config.models import Config
from sandbox.runtime.manager import SandboxManager
from sandbox.runtime.naming import Labels
from sandbox.runtime.protocol import SandboxInfo, unclaimed
from sandbox.runtime.spec import spec_from_config
from sandbox.sessions.child import REGISTRY_FILE, child_agent
from sandbox.sessions.registry import Child, Registry


@dataclass(frozen=True)
class SandboxRow:
    """One line of `sandbox list`."""

    info: SandboxInfo
    age_s: float
    idle_s: float
    config_match: bool | None  # None when the agent is no longer configured
    # "pool": a warm-pool member no session has yet (matched against its pool's config);
    # "child": the sandbox of a spawned session (matched as the child runs: its own view)
    role: str | None = None


def _seconds_since(iso: str | None) -> float:
    if not iso:
        return 0.0
    try:
        return max(0.0, (datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds())
    except ValueError:
        return 0.0


async def rows(manager: SandboxManager, *, matching: bool = True) -> list[SandboxRow]:
    """Every sandbox of this instance with age, idle time and whether its config still matches:
    a session's against its agent as that session runs it (a spawned child's own sandbox, with
    its parent's view), a free pool member's against its pool's config. With `matching` False
    the match and role stay None (prune and pause need neither, and the match is most of a
    listing's time: a spec made again per sandbox)."""
    last_used = manager.last_used()
    out = []
    merged = _Merged(manager.config)
    lineage = _Lineage(manager.config.state_dir)
    try:
        for info in await manager.list():
            match: bool | None = None
            role: str | None = None
            agent_id = None
            if matching and info.kind == "exec":
                agent_id = info.agent if info.agent in merged.known else _shared_agent(merged, info)
            if agent_id is not None:
                agent = merged.agent(agent_id)
                if unclaimed(info):
                    role = "pool"
                    match = await _pool_matches(manager, agent, info)
                else:
                    session = info.session or info.scope_key
                    child = lineage.child(session, info.tenant)
                    if child is not None:
                        role, agent = "child", child_agent(manager.config, agent, child)
                    match = await _config_matches(manager, agent, session, info)
            created = info.labels.get(Labels.CREATED_AT)
            out.append(
                SandboxRow(
                    info=info,
                    age_s=_seconds_since(created),
                    idle_s=_seconds_since(last_used.get(info.name) or created),
                    config_match=match,
                    role=role,
                )
            )
    finally:
        lineage.close()
    return out


async def _config_matches(manager: SandboxManager, agent: EffectiveAgent, session: str, info: SandboxInfo) -> bool:
    """Whether a session's sandbox is what `agent` would make for it now."""
    try:
        session = session if session.startswith("agent:") else agent.main_session_key
        image = await manager.backend.image_id(agent.sandbox.docker.image)
        full = spec_from_config(manager.config, agent, session, manager.instance, image_id=image)
        return full.config_hash == info.config_hash and agent.tenant == info.tenant
    except Exception:
        return False


async def _pool_matches(manager: SandboxManager, agent: EffectiveAgent, info: SandboxInfo) -> bool:
    """Whether a free pool member is of the pool its agent has now (else the pool sweeps it)."""
    if manager.pool is None:
        return False
    try:
        template = await manager.pool.member_spec(agent)
    except Exception:
        return False
    return template is not None and template.pool_key == info.labels.get(Labels.POOL) and agent.tenant == info.tenant


class _Lineage:
    """The spawned sessions' registry, opened once for a listing (absent: nothing was spawned)."""

    def __init__(self, state_dir: Path) -> None:
        self._registry: Registry | None = None
        if (state_dir / REGISTRY_FILE).exists():
            self._registry = Registry(state_dir / REGISTRY_FILE)

    def child(self, key: str, tenant: str) -> Child | None:
        found = self._registry.child(key) if self._registry is not None and key else None
        return found if found is not None and found.tenant == tenant else None

    def close(self) -> None:
        if self._registry is not None:
            self._registry.close()


class _Merged:
    """Each agent merged once for a listing (a merge copies the agent's models: at 1,000
    sandboxes of one agent, merging per sandbox was 0.25 s of a 0.7 s `sandbox list`)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.ids = agent_ids(config)  # in the config's order
        self.known = set(self.ids)
        self._merged: dict[str, EffectiveAgent] = {}

    def agent(self, agent_id: str) -> EffectiveAgent:
        found = self._merged.get(agent_id)
        if found is None:
            found = self._merged[agent_id] = effective_agent(self.config, agent_id)
        return found


def _shared_agent(merged: _Merged, info: SandboxInfo) -> str | None:
    """A configured agent of the container's tenant that uses shared scope (labels say agent `*`)."""
    if info.scope != "shared":
        return None
    for agent_id in merged.ids:
        agent = merged.agent(agent_id)
        if agent.sandbox.scope == "shared" and agent.tenant == info.tenant and agent.sandbox.mode != "off":
            return agent_id
    return None


async def recreate(
    manager: SandboxManager,
    *,
    all_: bool = False,
    agent: str | None = None,
    session: str | None = None,
    browser: bool = False,
) -> list[str]:
    """Remove the selected sandboxes; each is created afresh on next use."""
    removed = []
    for info in await manager.list():
        if (info.kind == "browser") != browser:
            continue
        selected = (
            all_
            or (agent is not None and info.agent == agent)
            or (session is not None and session in (info.session, info.scope_key))
        )
        if selected:
            await manager.remove(info)
            removed.append(info.name)
    return removed


async def prune(manager: SandboxManager, *, dry_run: bool = False) -> list[tuple[str, str]]:
    """Remove sandboxes idle longer than prune.idle_hours or older than prune.max_age_days.

    Each agent's own prune settings apply; 0 disables a rule. Returns (name, reason) pairs.
    """
    config = manager.config
    out = []
    pool = manager.pool
    stale_pool = await pool.stale() if pool is not None else []
    for info, why in stale_pool:
        if pool is not None and not dry_run:
            await pool.remove_member(info)
        out.append((info.name, why))
    gone = {info.id for info, _ in stale_pool}
    rules = {agent_id: effective_agent(config, agent_id).sandbox.prune for agent_id in agent_ids(config)}
    for row in await rows(manager, matching=False):
        if row.info.id in gone or unclaimed(row.info):
            continue  # pool containers are the pool's: stale ones went above, free ones stay
        prune_cfg = rules.get(row.info.agent) or config.agents.defaults.sandbox.prune
        reason = None
        if prune_cfg.idle_hours and row.idle_s > prune_cfg.idle_hours * 3600:
            reason = f"idle {row.idle_s / 3600:.1f} h > {prune_cfg.idle_hours} h"
        elif prune_cfg.max_age_days and row.age_s > prune_cfg.max_age_days * 86400:
            reason = f"age {row.age_s / 86400:.1f} d > {prune_cfg.max_age_days} d"
        if reason:
            if not dry_run:
                await manager.remove(row.info)
            out.append((row.info.name, reason))
    if not dry_run:  # what a crash or an outside removal left: edges, networks, half-made containers
        out += [(name, "orphan: its container is gone") for name in await manager.cleanup_orphans()]
    return out


async def pause_idle(manager: SandboxManager) -> list[tuple[str, str]]:
    """Pause the sandboxes nobody used for their agent's `sandbox.idle_pause_s` (the service does
    it periodically); (name, why) of each paused. Never one a call of this process uses, a free
    pool member (the pool hands out running ones only), a browser, or, with
    `idle_pause_keeps_processes`, one that runs a background process."""
    freezer = manager.backend.freezer()
    if freezer is None:
        return []
    merged = _Merged(manager.config)
    now = time.monotonic()
    out = []
    for row in await rows(manager, matching=False):
        info = row.info
        if info.status != "running" or info.kind != "exec" or unclaimed(info) or info.name in manager.in_use:
            continue
        agent_id = info.agent if info.agent in merged.known else _shared_agent(merged, info)
        if agent_id is None:
            continue
        cfg = merged.agent(agent_id).sandbox
        if not cfg.idle_pause_s:
            continue
        # this process's own record of its last use is exact; another's is the state dir's (coarser)
        used = manager.used_at.get(info.name)
        idle = now - used if used is not None else row.idle_s
        if idle < cfg.idle_pause_s:
            continue
        name = info.name
        busy = (lambda n=name: freezer.busy(n)) if cfg.idle_pause_keeps_processes else None
        if await manager.pause_if_idle(name, busy):
            out.append((name, f"idle {idle:.0f} s >= {cfg.idle_pause_s:g} s"))
    return out
