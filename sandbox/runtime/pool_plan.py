"""What every warm pool decides the same way, whatever its engine: which agents are pooled, the
spec a new member is made from, and how many more members a tenant's quota leaves room for.
The engines' pools (runtime/docker/pool.py, runtime/kubernetes/pool.py) differ only in how a
member is claimed and found."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from sandbox._log import logger
from sandbox.config.merge import EffectiveAgent, agent_ids, effective_agent
from sandbox.errors import SandboxError
from sandbox.runtime.protocol import RunRequest
from sandbox.runtime.spec import SandboxSpec, spec_from_config

if TYPE_CHECKING:
    from sandbox.runtime.manager import SandboxManager
    from sandbox.runtime.protocol import Backend, Sandbox, WarmPool

FILL_PARALLEL = 2  # creations at once per pool (what a 2-core engine sustains without starving calls)


def pooled_agents(manager: SandboxManager) -> list[EffectiveAgent]:
    """Configured agents whose sandboxes are pooled (size > 0, sandboxed, session scope)."""
    out = []
    for agent_id in agent_ids(manager.config):
        agent = effective_agent(manager.config, agent_id)
        if agent.sandbox.pool.size > 0 and agent.sandbox.mode != "off" and agent.sandbox.scope == "session":
            out.append(agent)
    return out


async def member_spec(manager: SandboxManager, backend: Backend, agent: EffectiveAgent) -> SandboxSpec | None:
    """The spec of a new pool member of `agent`, or None when its sandboxes cannot be pooled."""
    image = await backend.image_id(agent.sandbox.docker.image)
    placeholder = f"agent:{agent.id}:pool-{uuid.uuid4().hex[:12]}"
    spec = spec_from_config(manager.config, agent, placeholder, manager.instance, image_id=image)
    if spec.pool_key is None:
        return None
    return spec.as_pool_member()


async def room(manager: SandboxManager, backend: Backend, agent: EffectiveAgent) -> int:
    """How many more sandboxes the agent's tenant may have (tenants[].quotas.max_sandboxes)."""
    tenant = next((t for t in manager.config.tenants if t.id == agent.tenant), None)
    cap = tenant.quotas.max_sandboxes if tenant is not None else 0
    if not cap:
        return 1 << 30
    return cap - len(await backend.list(instance=manager.instance, tenant=agent.tenant))


async def wanted_keys(pool: WarmPool) -> set[str]:
    """The pool keys the current config wants (a member of any other key is stale)."""
    wanted: set[str] = set()
    for agent in pool.pooled_agents():
        with contextlib.suppress(SandboxError):
            template = await pool.member_spec(agent)
            if template is not None and template.pool_key is not None:
                wanted.add(template.pool_key)
    return wanted


async def sweep(pool: WarmPool) -> list[str]:
    """Remove `pool`'s stale members; their names."""
    removed = []
    for info, reason in await pool.stale():
        logger.bind(container=info.name, reason=reason).info("pool_member_removed")
        await pool.remove_member(info)
        removed.append(info.name)
    return removed


async def make_members(
    pool: WarmPool, backend: Backend, agent: EffectiveAgent, count: int, made: Callable[[Sandbox, SandboxSpec], None]
) -> int:
    """Start `count` members of `agent`'s pool, FILL_PARALLEL at a time, each with one command run
    (its agent is up and its record folder exists when a session comes); `made(box, spec)` is told
    of each. Returns how many were started."""
    limiter = anyio.CapacityLimiter(FILL_PARALLEL)
    started = 0

    async def one() -> None:
        nonlocal started
        async with limiter:
            spec = await pool.member_spec(agent)
            if spec is None:
                return
            box = await backend.ensure(spec)
            with contextlib.suppress(SandboxError):
                await box.run(RunRequest("true", call_id=f"pool-warm-{uuid.uuid4().hex[:8]}", timeout_s=30))
            made(box, spec)
            started += 1

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    return started
