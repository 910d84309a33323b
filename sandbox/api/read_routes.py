"""The service's read routes: probes, listings, explain, approvals, logs and /metrics.

Each tenant's reads are rate-limited (service.read_requests_per_minute, api/limits.py), and
what reads the journal or the engine runs off the event loop: a slow read costs its own request,
never everyone's. Journal reads take their threads from api/read_pool.py (a few per tenant, a
few in all, apart from the default pool): one tenant's slow pages queue behind its own, and the
probes, the engine's calls and other tenants' reads do not wait for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import anyio
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sandbox import __version__
from sandbox.api.approval_decisions import Verdict, decide_approval
from sandbox.api.auth import CallerDep, current_caller
from sandbox.api.bodies import mark_authenticated
from sandbox.api.limits import TenantLimits
from sandbox.api.metrics import Metrics
from sandbox.api.read_pool import ReadPool
from sandbox.api.readiness import SingleFlight
from sandbox.api.requests import ApprovalCheck, json_body, read_body
from sandbox.api.tenants import Caller, Tenants, tenant_agents
from sandbox.config.merge import probe_agent_id
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.errors import SandboxError
from sandbox.journal.approvals import Approval
from sandbox.policy import explain_data
from sandbox.tools import render

Format = Literal["openai", "anthropic", "mcp"]
SessionQuery = Annotated[str, Query(max_length=256)]
LOG_PAGE_MAX = 1000
NEXT_CURSOR = "X-Next-Cursor"


def add_read_routes(
    app: FastAPI,
    tenants: Tenants,
    limits: TenantLimits,
    metrics: Metrics,
    session_for: Callable[[Request, Caller, str, str | None], Session],
) -> None:
    """Register the read routes on `app`."""
    config = tenants.config
    reads = app.state.reads = ReadPool()

    def orch(request: Request) -> Orchestrator:
        found: Orchestrator = request.app.state.orch
        return found

    def reader(request: Request, who: Caller) -> Orchestrator:
        limits.read(who)
        return orch(request)

    async def pending_of(o: Orchestrator, who: Caller) -> list[Approval]:
        """Pending approvals: the shared store's (any replica's calls), else the journal's (in a read thread)."""
        store = o.approval_store
        if store is not None:
            return await store.approvals("pending")
        return await reads.run(who.tenant.id, o.pending_approvals)

    journal_probe: SingleFlight | None = None
    engine_probe: SingleFlight | None = None

    @app.get("/healthz")
    async def healthz() -> dict[str, bool | str]:
        return {"ok": True, "version": __version__}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        nonlocal journal_probe, engine_probe
        o = orch(request)
        spawn = request.app.state.spawn
        if journal_probe is None or engine_probe is None:
            journal = o.journal

            async def ping_journal() -> None:
                if journal is not None:
                    await anyio.to_thread.run_sync(journal.ping, abandon_on_cancel=True)

            async def ping_engine() -> None:
                agent = o.policy.agent(probe_agent_id(config))
                await o.backend.image_id(agent.sandbox.docker.image)

            journal_probe = SingleFlight("journal", ping_journal)
            engine_probe = SingleFlight("engine", ping_engine)
        checks: dict[str, str] = {}

        async def probe(flight: SingleFlight) -> None:
            checks[flight.name] = await flight.outcome(spawn)

        async with anyio.create_task_group() as tg:  # both at once: the bound is one wait, not two
            tg.start_soon(probe, journal_probe)
            tg.start_soon(probe, engine_probe)
        ready = all(v == "ok" for v in checks.values())
        ordered = {k: checks[k] for k in ("journal", "engine")}
        return JSONResponse({"ready": ready, "checks": ordered}, status_code=200 if ready else 503)

    @app.get("/v1/agents")
    async def agents(who: CallerDep) -> list[dict[str, Any]]:
        return [
            {
                "id": a.id,
                "tenant": a.tenant,
                "sandbox": {"mode": a.sandbox.mode, "scope": a.sandbox.scope},
            }
            for a in tenant_agents(config, who.tenant.id)
        ]

    @app.get("/v1/tools")
    async def tools(
        request: Request,
        who: CallerDep,
        session: SessionQuery,
        agent: str | None = None,
        format: Format = "openai",
    ) -> list[dict[str, Any]]:
        limits.read(who)
        return render(session_for(request, who, session, agent).tools(), format)

    @app.get("/v1/explain")
    async def explain(
        request: Request, who: CallerDep, session: SessionQuery, agent: str | None = None
    ) -> dict[str, Any]:
        limits.read(who)
        return explain_data(session_for(request, who, session, agent).policy)

    # the body is read by hand, after the token (FastAPI reads a body parameter before it checks one)
    @app.post("/v1/sessions/{key}/approval-check", openapi_extra=json_body(ApprovalCheck))
    async def approval_check(request: Request, key: str) -> dict[str, bool]:
        """Whether this call would wait for a human (`tools.approvals`): what an agent framework
        asks before it pauses for its own approval (docs/adapters.md). Counts as a read."""
        who = await current_caller(request)
        limits.read(who)
        body = await read_body(request, ApprovalCheck)
        return {"required": session_for(request, who, key, body.agent).approval_required(body.tool, body.args)}

    @app.get("/v1/sandboxes")
    async def sandboxes(request: Request, who: CallerDep) -> list[dict[str, Any]]:
        o = reader(request, who)
        found = await o.backend.list(instance=o.manager.instance, tenant=who.tenant.id)  # the engine filters
        return [
            {"name": s.name, "agent": s.agent, "scope": s.scope, "status": s.status, "created_at": s.created_at}
            for s in found
            if s.tenant == who.tenant.id
        ]

    @app.get("/v1/approvals")
    async def approvals(request: Request, who: CallerDep) -> list[dict[str, Any]]:
        o = reader(request, who)
        mine = tenants.agents(who.tenant.id)
        return [a.__dict__ for a in await pending_of(o, who) if a.agent in mine]

    @app.post("/v1/approvals/{approval_id}/{verdict}")
    async def decide(request: Request, who: CallerDep, approval_id: str, verdict: Verdict) -> dict[str, Any]:
        o = reader(request, who)  # counts toward the tenant's read rate, like the listing
        mine = tenants.agents(who.tenant.id)
        pending = {a.id: a for a in await pending_of(o, who) if a.agent in mine}
        if approval_id not in pending:
            raise HTTPException(404, f"no pending approval {approval_id!r}")
        return (await decide_approval(o, approval_id, verdict)).__dict__

    next_cursor_doc = {
        NEXT_CURSOR: {
            "description": "the cursor of the next (older) page; absent on the last page",
            "schema": {"type": "string"},
        }
    }

    @app.get("/v1/logs", responses={200: {"description": "events, newest first", "headers": next_cursor_doc}})
    async def logs(
        request: Request,
        response: Response,
        who: CallerDep,
        session: str | None = None,
        trace: str | None = None,
        since: float | None = None,
        until: float | None = None,
        cursor: Annotated[str | None, Query(max_length=512)] = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """This tenant's events, newest first, `limit` (at most 1000) a page; the next (older)
        page's cursor is in the X-Next-Cursor header (absent on the last page)."""
        # the tenant filter is inside the query: a busy neighbour never crowds a tenant's page
        query: dict[str, Any] = {
            "tenant": who.tenant.id,
            "session": session,
            "trace_id": trace,
            "since": since,
            "until": until,
            "cursor": cursor,
            "limit": max(1, min(limit, LOG_PAGE_MAX)),
        }
        store = getattr(request.app.state, "store", None)
        journal = reader(request, who).journal
        if store is not None:  # every replica's events (docs/state.md, "Events across replicas")
            page = await reads.run_async(who.tenant.id, lambda: store.events_page(**query))
        elif journal is not None:
            page = await reads.run(who.tenant.id, lambda: journal.page(**query))
        else:
            return []
        if page.next_cursor:
            response.headers[NEXT_CURSOR] = page.next_cursor
        return [e.__dict__ for e in page.events]

    @app.get("/metrics")
    async def prometheus(request: Request) -> Any:
        if not tenants.may_read_metrics(request.headers.get("authorization")):
            raise HTTPException(
                401,
                "/metrics needs one of service.metrics_tokens (a tenant's token does not do)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        mark_authenticated(request.scope)  # its connection is a known client's, not a stranger's
        o = orch(request)
        metrics.queue_depth.set(o.limiter.waiting)
        metrics.sandboxes.clear()
        try:
            for s in await o.backend.list(instance=o.manager.instance):
                metrics.sandboxes.labels(s.status).inc()
        except SandboxError:
            pass  # the engine is away: the call metrics are still worth reading
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
