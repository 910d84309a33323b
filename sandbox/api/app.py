"""The HTTP service (FastAPI): one Orchestrator, many tenants, each behind its bearer tokens.

Every request is authenticated first (401 without a valid token, before any of its body is
read: api/bodies.py); a resource of another tenant is 404, exactly like one that does not exist.
Tool-level failures are ToolResults (200); HTTP errors are kept for auth, tenancy, quotas (429
with Retry-After), unsandboxed sessions (403) and malformed requests. The read routes are in
api/read_routes.py, the edge's bounds in api/connections.py, api/quotas.py and api/limits.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sandbox._log import logger
from sandbox.api.auth import CallerDep, current_caller
from sandbox.api.bodies import BodyLimit
from sandbox.api.limits import TenantLimits
from sandbox.api.metrics import Metrics
from sandbox.api.quotas import Admission
from sandbox.api.read_routes import add_read_routes
from sandbox.api.requests import ERROR_RESPONSES, BatchRequest, CallRequest, json_body, read_body
from sandbox.api.serving import StopWatch, past_drain_deadline
from sandbox.api.tenants import Caller, Tenants
from sandbox.config.merge import EffectiveAgent
from sandbox.config.models import Config
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.errors import SandboxError, UsageError
from sandbox.journal.retention import keep_journal_bounded
from sandbox.policy.sessions import agent_of, key_problem

SSE_KEEPALIVE_S = 15.0
SSE_STOP_POLL_S = 1.0  # how soon an event stream notices the service is stopping
CLEANUP_WAIT_S = 20.0  # at shutdown, how long cancelled calls get to kill what they started
RECOVER_EVERY_S = 60.0
T = TypeVar("T")
__all__ = ["create_app", "current_caller", "resolve_session"]


def create_app(config: Config, orchestrator: Orchestrator | None = None) -> FastAPI:
    """The service over `config` (an Orchestrator is made, and recovered, at start-up unless given)."""
    metrics = Metrics()
    admission_of: list[Admission] = []  # made with the app (it reads the app's state)

    from sandbox.api.mcp_server import http_server

    tenants = Tenants(config)
    limits = TenantLimits(config.service)
    watch = StopWatch()  # stops calls whose client went away, or that outlive a stopping service's grace
    mcp_app, mcp_sessions = http_server(tenants, watch, lambda: app.state.orch, lambda: admission_of[0], metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if orchestrator is not None:
            app.state.orch = orchestrator
            metrics.know_tools(orchestrator.registry.names())
            async with anyio.create_task_group() as tg, mcp_sessions.run():
                app.state.spawn = tg.start_soon
                tg.start_soon(watch.run)
                yield
                tg.cancel_scope.cancel()
            return
        async with Orchestrator(config) as orch, anyio.create_task_group() as tg, mcp_sessions.run():
            app.state.spawn = tg.start_soon  # background work of requests (readiness probes)
            tg.start_soon(watch.run)
            await orch.recover()  # calls of orchestrators that are gone, never a live one's
            tg.start_soon(_recover_periodically, orch)
            tg.start_soon(orch.keep_pools_filled)  # the agents' warm pools (sandbox.pool.size)
            tg.start_soon(keep_journal_bounded, orch.journal, config.journal.retention)  # journal.retention
            metrics.know_tools(orch.registry.names())
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
    app.state.limits = limits
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

    add_read_routes(app, tenants, limits, metrics, session_for)

    # the hot route: its body and caller are read by hand (see read_body), documented the same way
    @app.post("/v1/sessions/{key}/calls", openapi_extra=json_body(CallRequest))
    async def call(request: Request, key: str) -> Any:
        who = await current_caller(request)
        admission.precheck(who)  # before the body is read: a tenant past its quota costs the others least
        async with limits.body_slot(who):  # a tenant's trickled bodies hold its own slots
            body = await read_body(request, CallRequest)
        session = session_for(request, who, key, body.agent)
        async with admission.admit(orch(request), who, session):
            result = await _unless_gone(request, watch, session.call(body.tool, body.args))
        if result is None:
            return _stopped(request, "call")
        metrics.record(who.tenant.id, result)
        # serialized once by pydantic, not walked again by FastAPI's encoder (a hot path)
        return Response(result.model_dump_json(), media_type="application/json")

    # read by hand too: FastAPI reads a body parameter before it checks the token
    @app.post("/v1/sessions/{key}/batches", openapi_extra=json_body(BatchRequest))
    async def batch(request: Request, key: str) -> Any:
        from sandbox.engine.batch import BatchCall, plan

        who = await current_caller(request)
        admission.precheck(who)
        async with limits.body_slot(who):
            body = await read_body(request, BatchRequest)
        session = session_for(request, who, key, body.agent)
        calls = [BatchCall(c.tool, c.args, c.id, tuple(c.depends_on)) for c in body.calls]
        try:  # every call counts; at once, as many as its widest wave
            width = max(len(wave) for wave in plan(calls, body.mode))
        except SandboxError:
            width = 1  # a bad batch: the engine refuses it before any call runs
        async with admission.admit(orch(request), who, session, calls=len(calls), slots=width):
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
        session = session_for(request, who, key, agent)
        give_back = limits.open_stream(who)  # 429 past service.max_event_streams_per_tenant
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

        def ended() -> None:
            unsubscribe()
            send.close()
            receive.close()
            give_back()

        async def stream() -> AsyncIterator[str]:
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

        return _Counted(stream(), ended, media_type="text/event-stream")

    @app.delete("/v1/sessions/{key}")
    async def close(request: Request, who: CallerDep, key: str, agent: str | None = None) -> dict[str, Any]:
        closed = await session_for(request, who, key, agent).close()
        admission.closed(who.tenant.id, closed)
        return {"closed": closed}

    return app


class _Counted(StreamingResponse):
    """A stream whose `ended` runs once it is over, however it ends (even never started: a
    generator's own `finally` would not run then, and the stream would stay counted)."""

    def __init__(self, content: AsyncIterator[str], ended: Callable[[], None], media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._ended = ended

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ended()


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
