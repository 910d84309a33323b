"""The bearer-token dependency every tenant route declares, and the session a tenant's request
may reach (the REST routes and MCP over HTTP alike)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, HTTPException, Request

from sandbox.api.bodies import mark_authenticated, unauthenticated
from sandbox.api.tenants import Caller, Tenants
from sandbox.errors import UsageError
from sandbox.policy.sessions import agent_of, key_problem

if TYPE_CHECKING:
    from sandbox.config.merge import EffectiveAgent
    from sandbox.engine.orchestrator import Orchestrator, Session


async def current_caller(request: Request) -> Caller:
    """The tenant behind the request's bearer token; 401 otherwise. Only then may the request's
    body be read (api/bodies.py), and its connection counts as a tenant's (api/connections.py).

    Async although it blocks on nothing (hashing, a stat of the token file): a plain function
    would cost every request a trip through the thread pool."""
    tenants: Tenants = request.app.state.tenants
    found = tenants.from_authorization(request.headers.get("authorization"))
    if found is None:
        raise unauthenticated()
    mark_authenticated(request.scope)
    return found


# FastAPI reads route annotations by name from the module that defines the route
CallerDep = Annotated[Caller, Depends(current_caller)]


def agent_for(tenants: Tenants, who: Caller, key: str, agent: str | None) -> EffectiveAgent:
    """The agent a request names (`agent`, else the key's, else the tenant's default); 404 across tenants."""
    problem = key_problem(key)
    if problem:
        raise HTTPException(400, problem)
    wanted = agent or agent_of(key)
    if wanted is None:
        fallback = tenants.default_agent(who.tenant.id)
        if fallback is None:
            raise HTTPException(404, "this tenant has no agents")
        return fallback
    found = tenants.agents(who.tenant.id).get(wanted)
    if found is None:  # another tenant's agent looks exactly like a missing one
        raise HTTPException(404, f"no agent {wanted!r}")
    return found


def resolve_session(tenants: Tenants, orch: Orchestrator, who: Caller, key: str, agent: str | None) -> Session:
    """The session a request names, as this tenant may reach it (HTTP errors otherwise)."""
    target = agent_for(tenants, who, key, agent)
    try:
        session = orch.session(key, agent=target.id)
    except UsageError as exc:
        raise HTTPException(400, exc.message) from exc
    if not session.sandboxed and not who.tenant.allow_unsandboxed:
        raise HTTPException(
            403,
            f"session {key!r} of agent {target.id!r} is not sandboxed; this tenant may reach only "
            "sandboxed sessions (tenants[].allow_unsandboxed)",
        )
    return session
