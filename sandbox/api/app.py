"""The HTTP service (FastAPI): one Orchestrator, many tenants, each behind its bearer tokens.

Every request is authenticated first (401 without a valid token); a resource of another tenant
is 404, exactly like one that does not exist. Tool-level failures are ToolResults (200); HTTP
errors are kept for auth, tenancy, quotas (429 with Retry-After), unsandboxed sessions (403)
and malformed requests.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, TypeVar

import anyio
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response

from sandbox._log import logger
from sandbox.api.metrics import Metrics
from sandbox.api.quotas import Admission
from sandbox.api.requests import ERROR_RESPONSES, BatchRequest, BodyLimit, CallRequest, json_body, read_body
from sandbox.api.serving import StopWatch, past_drain_deadline
from sandbox.api.tenants import Caller, Tenants, tenant_agents
from sandbox.config.merge import EffectiveAgent, default_agent_id
from sandbox.config.models import Config
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.errors import SandboxError, UsageError
from sandbox.policy.sessions import agent_of, key_problem

SSE_KEEPALIVE_S = 15.0
SSE_STOP_POLL_S = 1.0  # how soon an event stream notices the service is stopping
CLEANUP_WAIT_S = 20.0  # at shutdown, how long cancelled calls get to kill what they started
RECOVER_EVERY_S = 60.0
T = TypeVar("T")


async def current_caller(request: Request) -> Caller:
    """The tenant behind the request's bearer token; 401 otherwise.

    Async although it blocks on nothing (hashing, a stat of the token file): a plain function
    would cost every request a trip through the thread pool."""
    tenants: Tenants = request.app.state.tenants
    found = tenants.from_authorization(request.headers.get("authorization"))
    if found is None:
        raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
    return found


# FastAPI reads the annotations by name from this module (routes are made inside create_app)
CallerDep = Annotated[Caller, Depends(current_caller)]
Format = Literal["openai", "anthropic", "mcp"]
Verdict = Literal["approve", "deny"]
SessionQuery = Annotated[str, Query(max_length=256)]


def create_app(config: Config, orchestrator: Orchestrator | None = None) -> FastAPI:
    """The service over `config` (an Orchestrator is made, and recovered, at start-up unless given)."""
    metrics = Metrics()
    admission_of: list[Admission] = []  # made with the app (it reads the app's state)

    from sandbox.api.mcp_server import http_server

    tenants = Tenants(config)
    watch = StopWatch()  # stops calls whose client went away, or that outlive a stopping service's grace
    mcp_app, mcp_sessions = http_server(tenants, watch, lambda: app.state.orch, lambda: admission_of[0])

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if orchestrator is not None:
            app.state.orch = orchestrator
            async with anyio.create_task_group() as tg, mcp_sessions.run():
                tg.start_soon(watch.run)
                yield
                tg.cancel_scope.cancel()
            return
        async with Orchestrator(config) as orch, anyio.create_task_group() as tg, mcp_sessions.run():
            tg.start_soon(watch.run)
            await orch.recover()  # calls of orchestrators that are gone, never a live one's
            tg.start_soon(_recover_periodically, orch)
            tg.start_soon(orch.keep_pools_filled)  # the agents' warm pools (sandbox.pool.size)
            app.state.orch = orch
            yield
            # uvicorn cancelled what outlived the grace period; their clean-up (killing what
            # they started, journaling them abandoned) finishes before the orchestrator closes
            with anyio.move_on_after(CLEANUP_WAIT_S):
                while admission.in_flight():  # noqa: ASYNC110 - a counter, no event
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    # the refusals every route may answer, documented so that clients (and the fuzzer) can check them
    app = FastAPI(title="agent-sandbox", version="1", lifespan=lifespan, responses=ERROR_RESPONSES)
    # set on SIGTERM/SIGINT (api/serving.py): streams end, new calls are refused, and calls still
    # running at the deadline are stopped
    app.state.stopping = False
    app.state.drain_deadline = None
    admission = Admission(app.state, metrics)
    admission_of.append(admission)
    app.state.config = config
    app.state.tenants = tenants
    app.mount("/mcp", mcp_app)  # MCP over streamable HTTP, behind the same bearer tokens

    app.add_middleware(BodyLimit)

    @app.exception_handler(SandboxError)
    async def sandbox_error(request: Request, exc: SandboxError) -> JSONResponse:
        # a refusal that is not a tool call's result (a bad batch, a bad key): its own HTTP status
        status = exc.http_status
        if status == 422:  # 422 is FastAPI's documented validation shape; a refusal is a plain 400
            status = 400
        return JSONResponse({"detail": exc.message, "code": exc.code.value}, status_code=status)

    def orch(request: Request) -> Orchestrator:
        found: Orchestrator = request.app.state.orch
        return found

    def session_for(request: Request, who: Caller, key: str, agent: str | None) -> Session:
        return resolve_session(tenants, orch(request), who, key, agent)

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        checks: dict[str, str] = {}
        o = orch(request)
        try:
            if o.journal is not None:
                o.journal.health()
            checks["journal"] = "ok"
        except Exception as exc:  # any failure is "not ready", said plainly
            checks["journal"] = f"failed: {exc}"
        try:
            agent = o.policy.agent(default_agent_id(config))
            await o.backend.image_id(agent.sandbox.docker.image)
            checks["engine"] = "ok"
        except SandboxError as exc:
            checks["engine"] = f"failed: {exc.message}"
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

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
        from sandbox.tools import render

        return render(session_for(request, who, session, agent).tools(), format)

    @app.get("/v1/explain")
    async def explain(
        request: Request, who: CallerDep, session: SessionQuery, agent: str | None = None
    ) -> dict[str, Any]:
        from sandbox.policy import explain_data

        return explain_data(session_for(request, who, session, agent).policy)

    # the hot route: its body and caller are read by hand (see read_body), documented the same way
    @app.post("/v1/sessions/{key}/calls", openapi_extra=json_body(CallRequest))
    async def call(request: Request, key: str) -> Any:
        who = await current_caller(request)
        admission.rate(who)  # before the body is read: a tenant past its quota costs the others least
        body = await read_body(request, CallRequest)
        session = session_for(request, who, key, body.agent)
        await admission.session(orch(request), who, session)
        async with admission.running(who):
            result = await _unless_gone(request, watch, session.call(body.tool, body.args))
        if result is None:
            return _stopped(request, "call")
        metrics.record(who.tenant.id, result)
        # serialized once by pydantic, not walked again by FastAPI's encoder (a hot path)
        return Response(result.model_dump_json(), media_type="application/json")

    @app.post("/v1/sessions/{key}/batches")
    async def batch(request: Request, who: CallerDep, key: str, body: BatchRequest) -> Any:
        from sandbox.engine.batch import BatchCall

        admission.rate(who)
        session = session_for(request, who, key, body.agent)
        await admission.session(orch(request), who, session)
        calls = [BatchCall(c.tool, c.args, c.id, tuple(c.depends_on)) for c in body.calls]
        async with admission.running(who):
            outcome = await _unless_gone(request, watch, session.call_many(calls, mode=body.mode))
        if outcome is None:
            return _stopped(request, "batch")
        for result in outcome.results:
            metrics.record(who.tenant.id, result)
        return {
            "status": outcome.status,
            "failed": outcome.failed,
            "results": [r.model_dump(mode="json") for r in outcome.results],
        }

    @app.get("/v1/sessions/{key}/events")
    async def events(request: Request, who: CallerDep, key: str, agent: str | None = None) -> Any:
        """Server-sent events: the progress of this session's calls, as they happen."""
        from fastapi.responses import StreamingResponse

        session = session_for(request, who, key, agent)
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](max_buffer_size=256)

        def forward(event: Any) -> None:
            if event.session == session.key:
                with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    send.send_nowait(
                        {
                            "kind": event.kind,
                            "call_id": event.call_id,
                            "tool": event.tool,
                            "elapsed_s": round(event.elapsed_s, 3),
                            **event.detail,
                        }
                    )

        unsubscribe = orch(request).progress.subscribe(forward)

        async def stream() -> AsyncIterator[str]:
            try:
                yield ": connected\n\n"
                quiet_since = anyio.current_time()
                # checked every second: a stream would otherwise hold a stopping service's drain
                while not request.app.state.stopping and not await request.is_disconnected():
                    with anyio.move_on_after(SSE_STOP_POLL_S):
                        item = await receive.receive()
                        yield f"event: {item['kind']}\ndata: {json.dumps(item, default=str)}\n\n"
                        quiet_since = anyio.current_time()
                        continue
                    if anyio.current_time() - quiet_since >= SSE_KEEPALIVE_S:
                        yield ": keep-alive\n\n"
                        quiet_since = anyio.current_time()
            finally:
                unsubscribe()
                send.close()
                receive.close()

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.get("/v1/sandboxes")
    async def sandboxes(request: Request, who: CallerDep) -> list[dict[str, Any]]:
        o = orch(request)
        found = await o.backend.list(instance=o.manager.instance)
        return [
            {"name": s.name, "agent": s.agent, "scope": s.scope, "status": s.status, "created_at": s.created_at}
            for s in found
            if s.tenant == who.tenant.id
        ]

    @app.get("/metrics")
    async def prometheus(request: Request) -> Any:
        from fastapi.responses import Response
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if not tenants.may_read_metrics(request.headers.get("authorization")):
            raise HTTPException(
                401,
                "/metrics needs one of service.metrics_tokens (a tenant's token does not do)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        o = orch(request)
        metrics.queue_depth.set(o.limiter.waiting)
        metrics.sandboxes.clear()
        try:
            for s in await o.backend.list(instance=o.manager.instance):
                metrics.sandboxes.labels(s.status).inc()
        except SandboxError:
            pass  # the engine is away: the call metrics are still worth reading
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.delete("/v1/sessions/{key}")
    async def close(request: Request, who: CallerDep, key: str, agent: str | None = None) -> dict[str, Any]:
        closed = await session_for(request, who, key, agent).close()
        admission.closed(who.tenant.id, closed)
        return {"closed": closed}

    @app.get("/v1/approvals")
    async def approvals(request: Request, who: CallerDep) -> list[dict[str, Any]]:
        mine = tenants.agents(who.tenant.id)
        return [a.__dict__ for a in orch(request).pending_approvals() if a.agent in mine]

    @app.post("/v1/approvals/{approval_id}/{verdict}")
    async def decide(request: Request, who: CallerDep, approval_id: str, verdict: Verdict) -> dict[str, Any]:
        o = orch(request)
        mine = tenants.agents(who.tenant.id)
        pending = {a.id: a for a in o.pending_approvals() if a.agent in mine}
        if approval_id not in pending:
            raise HTTPException(404, f"no pending approval {approval_id!r}")
        try:
            decided = o.approve(approval_id) if verdict == "approve" else o.deny(approval_id)
        except SandboxError as exc:
            raise HTTPException(409, exc.message) from exc
        return decided.__dict__

    @app.get("/v1/logs")
    async def logs(
        request: Request, who: CallerDep, session: str | None = None, trace: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        journal = orch(request).journal
        if journal is None:
            return []
        events = journal.events(session=session, trace_id=trace, limit=max(1, min(limit, 10_000)))
        return [e.__dict__ for e in events if e.tenant == who.tenant.id]

    return app


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


async def _recover_periodically(orch: Orchestrator) -> None:
    """Settle, every minute, the calls of orchestrators that died meanwhile (a CLI killed with -9)."""
    while True:
        await anyio.sleep(RECOVER_EVERY_S)
        try:
            await orch.recover()
        except SandboxError as exc:  # the engine away for a while: try again next time
            logger.bind(reason=exc.message).warning("service_recovery_failed")


def _stopped(request: Request, what: str) -> JSONResponse:
    """The answer for a call stopped before it finished (what it started was killed)."""
    if past_drain_deadline(request.app.state):
        return JSONResponse(
            {"detail": f"the service stopped before the {what} finished; it was stopped and its commands killed"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    # nobody is listening any more; the status is for the access log
    return JSONResponse({"detail": f"the client went away; the {what} was stopped"}, status_code=499)


async def _unless_gone(request: Request, watch: StopWatch, work: Awaitable[T]) -> T | None:
    """`work`, cancelled when the client disconnects or the service's drain deadline passes."""

    async def stop() -> bool:
        # the server says "disconnected" only when asked: there is no event to wait on
        return past_drain_deadline(request.app.state) or await request.is_disconnected()

    return await watch.until_stopped(stop, work)
