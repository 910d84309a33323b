"""The HTTP service (FastAPI): one Orchestrator, many tenants, each behind its bearer tokens.

Every request is authenticated first (401 without a valid token, before any of its body is
read: api/bodies.py); a resource of another tenant is 404, exactly like one that does not exist.
Tool-level failures are ToolResults (200); HTTP errors are kept for auth, tenancy, quotas (429
with Retry-After), unsandboxed sessions (403) and malformed requests. The routes are in
api/read_routes.py and api/call_routes.py (this module only assembles them), the edge's bounds
in api/connections.py, api/quotas.py and api/limits.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar, cast

import anyio
from anyio.abc import TaskStatus
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.requests import HTTPConnection

from sandbox._log import logger
from sandbox.api.auth import current_caller, resolve_session
from sandbox.api.bodies import BodyLimit
from sandbox.api.call_routes import add_call_routes
from sandbox.api.console.routes import add_console
from sandbox.api.console.views import Auditor
from sandbox.api.handle_routes import add_handle_routes
from sandbox.api.limits import TenantLimits
from sandbox.api.mcp_server import http_server
from sandbox.api.metrics import Metrics
from sandbox.api.preview_routes import add_preview_routes
from sandbox.api.progress_relay import ProgressRelay
from sandbox.api.quotas import Admission
from sandbox.api.read_routes import add_read_routes
from sandbox.api.requests import ERROR_RESPONSES
from sandbox.api.serving import StopWatch
from sandbox.api.shared_tokens import keep_tokens_shared
from sandbox.api.tenants import Caller, Tenants
from sandbox.config.models import Config
from sandbox.engine.handover import adopt_orphans, hand_over, handover_on
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.errors import SandboxError
from sandbox.journal.retention import Retention, keep_journal_bounded
from sandbox.sessions.shared_registry import SharedRegistry
from sandbox.state import open_store
from sandbox.state.protocol import SharedStore
from sandbox.state.shipping import keep_shared_events_bounded, ship_journal

CLEANUP_WAIT_S = 20.0  # at shutdown, how long cancelled calls get to kill what they started
RECOVER_EVERY_S = 60.0
T = TypeVar("T")
__all__ = ["create_app", "current_caller", "resolve_session"]


def create_app(config: Config, orchestrator: Orchestrator | None = None, auditor: Auditor | None = None) -> FastAPI:
    """The service over `config` (an Orchestrator is made, and recovered, at start-up unless given);
    `auditor` gives the console's sandboxes page the audit's findings (api/console/views.py)."""
    metrics = Metrics()
    admission_of: list[Admission] = []  # made with the app (it reads the app's state)
    tenants = Tenants(config)
    limits = TenantLimits(config.service)
    watch = StopWatch()  # stops calls whose client went away, or that outlive a stopping service's grace
    mcp_app, mcp_sessions = http_server(tenants, watch, lambda: app.state.orch, lambda: admission_of[0], metrics)
    lifespan = _lifespan(config, orchestrator, metrics, watch, mcp_sessions, admission_of)

    # the refusals every route may answer, documented so that clients (and the fuzzer) can check them
    # with the console on, no Swagger or ReDoc pages: they load scripts from a CDN into the
    # console's origin (the OpenAPI document stays at /openapi.json)
    console = bool(config.service.operator_tokens)
    app = FastAPI(
        title="agent-sandbox",
        version="1",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        docs_url=None if console else "/docs",
        redoc_url=None if console else "/redoc",
    )
    # set on SIGTERM/SIGINT (api/serving.py): streams end, new calls are refused, and calls still
    # running at the deadline are stopped
    app.state.stopping = False
    app.state.drain_deadline = None
    app.state.keyed_batches = {}  # (tenant, key and batch) -> its run in this process (api/handle_routes.py)
    admission = Admission(app.state, metrics)
    admission_of.append(admission)
    app.state.config = config
    app.state.tenants = tenants
    app.state.limits = limits
    app.mount("/mcp", mcp_app)  # MCP over streamable HTTP, behind the same bearer tokens

    app.add_middleware(BodyLimit)
    app.add_exception_handler(SandboxError, _sandbox_error)  # type: ignore[arg-type]

    def session_for(request: HTTPConnection, who: Caller, key: str, agent: str | None) -> Session:
        found: Orchestrator = request.app.state.orch
        return resolve_session(tenants, found, who, key, agent)

    add_read_routes(app, tenants, limits, metrics, session_for)
    add_call_routes(app, limits, metrics, admission, watch, session_for)
    add_handle_routes(app)
    add_preview_routes(app, tenants, session_for)  # /v1/sessions/{key}/ports/..., /v1/previews/...
    add_console(app, config, auditor)  # /ui, for operators (service.operator_tokens)
    return app


def _lifespan(
    config: Config,
    orchestrator: Orchestrator | None,
    metrics: Metrics,
    watch: StopWatch,
    mcp_sessions: Any,
    admission_of: list[Admission],
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The service's start and stop: the orchestrator (made and recovered unless given), its background work."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if orchestrator is not None:
            app.state.orch = orchestrator
            metrics.know_tools(orchestrator.registry.names())
            async with (
                shared_store(config, admission_of[0]) as store,
                anyio.create_task_group() as tg,
                mcp_sessions.run(),
            ):
                orchestrator.share_approvals(store)
                orchestrator.share_calls(store)
                orchestrator.share_session_uids(store)
                app.state.store = store
                app.state.spawn = tg.start_soon
                tg.start_soon(watch.run)
                await _share_state(tg, app, orchestrator, store, config)
                yield
                tg.cancel_scope.cancel()
            return
        async with (
            shared_store(config, admission_of[0]) as store,
            Orchestrator(config) as orch,
            anyio.create_task_group() as tg,
            mcp_sessions.run(),
        ):
            orch.share_approvals(store)
            orch.share_calls(store)
            orch.share_session_uids(store)
            app.state.store = store
            await _share_state(tg, app, orch, store, config)
            app.state.spawn = tg.start_soon  # background work of requests (readiness probes)
            tg.start_soon(watch.run)
            await orch.recover()  # calls of orchestrators that are gone, never a live one's
            tg.start_soon(_recover_periodically, orch)
            if store is not None:  # another replica's running calls, once it is gone: within a quarter lease
                tg.start_soon(_adopt_orphans_periodically, orch, max(config.state.lease_s / 4, 1.0))
            tg.start_soon(orch.keep_pools_filled)  # the agents' warm pools (sandbox.pool.size)
            tg.start_soon(orch.keep_idle_paused)  # sandbox.idle_pause_s
            tg.start_soon(keep_journal_bounded, orch.journal, config.journal.retention)  # journal.retention
            bound = Retention.of(config.journal.retention)  # and the sessions registry's inboxes and lineage
            tg.start_soon(orch.sessions.keep_bounded, bound.max_age_s, bound.every_s)
            metrics.know_tools(orch.registry.names())
            app.state.orch = orch
            yield
            # durable calls still running go on for the next orchestrator to adopt (service.handover)
            handed = hand_over(orch) if handover_on(config) else []
            held = len([c for c in handed if c not in orch.handover.adopted])  # adopted ones hold no slot
            # uvicorn cancelled what outlived the grace period; their clean-up (killing what
            # they started, journaling them abandoned) finishes before the orchestrator closes
            with anyio.move_on_after(CLEANUP_WAIT_S):
                while admission_of[0].in_flight() > held:  # noqa: ASYNC110 - a counter, no event
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    return lifespan


@asynccontextmanager
async def shared_store(config: Config, admission: Admission) -> AsyncIterator[SharedStore | None]:
    """With `state.url: postgresql://...`, the shared store holds the call quotas, the approvals
    and the call records while the service runs (docs/state.md); with SQLite (the default)
    nothing changes (yields None)."""
    url = config.state.parsed()
    if url.kind != "postgresql":
        yield None
        return
    async with open_store(url, config.state_dir, lease_s=config.state.lease_s) as store:
        shared = cast("SharedStore", store)  # a PostgreSQL store is the shared one (postgres/store.py)
        admission.store, admission.makes = shared, shared
        try:
            yield shared
        finally:
            admission.store, admission.makes = None, None


async def _share_state(tg: Any, app: FastAPI, orch: Orchestrator, store: SharedStore | None, config: Config) -> None:
    """With a shared store: take its tenant tokens (loaded before this returns, kept current),
    ship this replica's journal to it, keep the shared events within `journal.retention`, and
    relay progress events between replicas (docs/state.md, "Events across replicas", "Tokens")."""
    if store is None:
        return
    await tg.start(keep_tokens_shared, app.state.tenants, store)
    await tg.start(_share_registry, orch, config)
    tg.start_soon(ProgressRelay(orch.progress, store).run)
    if orch.journal is not None:
        tg.start_soon(ship_journal, orch.journal, store)
        tg.start_soon(keep_shared_events_bounded, store, config.journal.retention)


async def _share_registry(
    orch: Orchestrator, config: Config, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """The sessions registry in the shared store while the service runs (sub-agents spawned
    through any replica are known to all); the state dir's again when it stops."""
    from sandbox.state.postgres.registry import PgRegistry  # psycopg only with a PostgreSQL store

    rows = await anyio.to_thread.run_sync(PgRegistry, config.state.parsed())
    orch.sessions.share_registry(SharedRegistry(rows))
    task_status.started()
    try:
        await anyio.sleep_forever()
    finally:
        orch.sessions.share_registry(None)


async def _sandbox_error(request: Request, exc: SandboxError) -> JSONResponse:
    """A refusal that is not a tool call's result (a bad batch, a bad key): its own HTTP status."""
    status = exc.http_status
    if status == 422:  # 422 is FastAPI's documented validation shape; a refusal is a plain 400
        status = 400
    return JSONResponse({"detail": exc.message, "code": exc.code.value}, status_code=status)


async def _adopt_orphans_periodically(orch: Orchestrator, every_s: float) -> None:
    """Adopt or settle, in the shared store, the running calls of replicas that are gone."""
    while True:
        await anyio.sleep(every_s)
        try:
            await adopt_orphans(orch)
        except Exception as exc:  # the store or the engine away for a while: next time
            logger.bind(reason=f"{type(exc).__name__}: {exc}"[:300]).warning("service_orphans_not_settled")


async def _recover_periodically(orch: Orchestrator) -> None:
    """Settle, every minute, the calls of orchestrators that died meanwhile (a CLI killed with -9)."""
    while True:
        await anyio.sleep(RECOVER_EVERY_S)
        try:
            await orch.recover()
        except SandboxError as exc:  # the engine away for a while: try again next time
            logger.bind(reason=exc.message).warning("service_recovery_failed")
