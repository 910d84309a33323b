"""MCP over stdio (`sandbox mcp --agent A`): one agent's policy-filtered tools for a desktop client.

`tools/list` is exactly what the session's model may call (allowed *and* provided); `tools/call`
runs through the same engine as every other call. A tool-level failure is a result with
`isError` and the ToolResult JSON as its text, so the model can read the code and act on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import mcp_types as types
from fastapi import HTTPException
from fastapi.responses import JSONResponse
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.shared.exceptions import MCPError

from sandbox._log import logger
from sandbox.api.auth import resolve_session
from sandbox.api.bodies import mark_authenticated
from sandbox.api.mcp_sessions import OwnedSessions, owner_of
from sandbox.api.quotas import Admission
from sandbox.api.serving import StopWatch, past_drain_deadline
from sandbox.api.tenants import Caller, Tenants
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.errors import SandboxError
from sandbox.tools.formats import render

if TYPE_CHECKING:
    from sandbox.api.metrics import Metrics  # only the service makes them (prometheus_client)


def tools_of(session: Session) -> types.ListToolsResult:
    """`tools/list`: what `session`'s model may call (allowed and provided)."""
    return types.ListToolsResult(
        tools=[
            types.Tool(name=t["name"], description=t.get("description"), input_schema=t["inputSchema"])
            for t in render(session.tools(), "mcp")
        ]
    )


IDEMPOTENCY_META = "agent-sandbox.io/idempotency-key"  # `_meta` of a tools/call (docs/calls.md)


async def call_in(session: Session, params: types.CallToolRequestParams) -> types.CallToolResult:
    """`tools/call` through the engine: the ToolResult as text and structured content. A key in
    `_meta` (IDEMPOTENCY_META) runs the call once for it, as the HTTP header does."""
    key = (params.meta or {}).get(IDEMPOTENCY_META)
    result = await session.call(params.name, params.arguments or {}, idempotency_key=None if key is None else str(key))
    body = result.model_dump(mode="json")
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body))], structured_content=body, is_error=not result.ok
    )


def build_server(session: Session) -> Server[Any]:
    """An MCP server whose tools are `session`'s."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        del ctx, params
        return tools_of(session)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        del ctx
        return await call_in(session, params)

    return Server("agent-sandbox", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(orch: Orchestrator, session: Session) -> None:
    """Serve `session` over this process's stdin/stdout until the client closes."""
    server = build_server(session)
    await orch.recover(adopt=False)  # a stdio server lives as long as its client: durable calls are the service's
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def http_server(
    tenants: Tenants,
    watch: StopWatch,
    get_orch: Callable[[], Orchestrator],
    get_admission: Callable[[], Admission],
    metrics: Metrics | None = None,
) -> tuple[Any, Any]:
    """`/mcp` for the service: (an ASGI app behind the bearer auth, its session manager to run).

    Each request names its session with `X-Sandbox-Agent` / `X-Sandbox-Session` (defaults: the
    tenant's default agent, and one session per MCP session); the tenant comes from the token,
    and the same rules as the REST routes apply: another tenant's agent is "no agent", the
    tenant's quotas hold, and a call still running when a stopping service's grace ends is stopped.
    An MCP session belongs to the tenant and the token that opened it (any other token on it is
    404, as if it did not exist), a tenant holds at most service.max_mcp_sessions_per_tenant of
    them (429 past it), and one idle for service.mcp_session_idle_s ends.

    With service.mcp_stateless there are no MCP sessions: each request stands alone (any replica
    answers it), and its sandbox session is X-Sandbox-Session's or `mcp-default`.
    """
    service = tenants.config.service
    # the orchestrator sessions each MCP session used under its own default key (mcp-<id>), to
    # close when it ends; a session named by X-Sandbox-Session outlives it (REST DELETE ends it)
    used: dict[str, dict[tuple[str, str], Session]] = {}

    def caller_and_session(ctx: Any) -> tuple[Caller, Session]:
        headers = ctx.request.headers if ctx.request is not None else {}
        who = tenants.from_authorization(headers.get("authorization"))
        if who is None:
            raise PermissionError("a valid bearer token is required")
        agent = headers.get("x-sandbox-agent")
        # stateless: the header is the client's word, not a session of ours (the SDK checks none)
        sid = None if service.mcp_stateless else headers.get("mcp-session-id")
        named = headers.get("x-sandbox-session")
        key = named or f"mcp-{str(sid or 'default')[:32]}"
        try:
            session = resolve_session(tenants, get_orch(), who, key, agent)
        except HTTPException as exc:
            raise PermissionError(str(exc.detail)) from exc
        except SandboxError as exc:  # no default agent for this tenant: the same words as REST's 400
            raise PermissionError(exc.message) from exc
        if named is None and sid is not None and manager.is_open(sid):
            used.setdefault(sid, {})[(who.tenant.id, session.agent.id)] = session
        return who, session

    async def ended(sid: str) -> None:
        """An MCP session ended: close the sessions it used by default (a session-scoped
        sandbox goes) and give their places back toward max_sessions."""
        for (tenant, _agent), session in used.pop(sid, {}).items():
            keys = [session.key]
            try:
                keys = await session.close() or keys
            finally:
                await get_admission().closed(tenant, keys)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        del params
        return tools_of(caller_and_session(ctx)[1])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        admission = get_admission()
        who, session = caller_and_session(ctx)

        async def stop() -> bool:
            return past_drain_deadline(admission.state)

        try:
            async with admission.admit(get_orch(), who, session):
                result = await watch.until_stopped(stop, call_in(session, params))
        except HTTPException as exc:  # the REST routes' 429/503, as an MCP error with the same words
            # an expected refusal: an MCPError is answered as is, without the SDK's traceback
            logger.bind(tenant=who.tenant.id, status=exc.status_code).info("mcp_call_refused")
            raise MCPError(code=0, message=str(exc.detail)) from None
        if result is None:
            raise RuntimeError("the service stopped before the call finished; it was stopped and its commands killed")
        if metrics is not None and result.structured_content is not None:
            metrics.record_body(who.tenant.id, result.structured_content)
        return result

    server: Server[Any] = Server("agent-sandbox", version="1", on_list_tools=list_tools, on_call_tool=call_tool)
    manager = OwnedSessions(
        server,
        json_response=True,
        per_tenant=service.max_mcp_sessions_per_tenant,
        session_idle_timeout=service.mcp_session_idle_s,
        max_sessions=service.max_mcp_sessions_per_tenant * max(1, len(tenants.config.tenants)),
        stateless=service.mcp_stateless,
    )
    manager.on_end = ended
    inner = StreamableHTTPASGIApp(manager)

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        # the bearer check happens before the MCP layer sees the request (or its body) at all
        if scope["type"] == "http":
            headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
            authorization = headers.get("authorization")
            who = tenants.from_authorization(authorization)
            if who is None:
                response = JSONResponse(
                    {"detail": "a valid bearer token is required"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
            mark_authenticated(scope)
            if service.mcp_stateless and scope.get("method") != "POST":
                # no sessions: nothing to DELETE, and no stream to hold open per GET (unbounded)
                response = JSONResponse(
                    {"detail": "MCP here is stateless (service.mcp_stateless): POST each request"},
                    status_code=405,
                    headers={"Allow": "POST"},
                )
                await response(scope, receive, send)
                return
            # the SDK binds a session to this principal: another token on it is 404
            scope["user"] = owner_of(who, authorization)
            if "mcp-session-id" not in headers and manager.held_by(who.tenant.id) >= manager.per_tenant:
                response = JSONResponse(
                    {
                        "detail": f"tenant {who.tenant.id!r} has {manager.held_by(who.tenant.id)} MCP sessions open "
                        f"(service.max_mcp_sessions_per_tenant is {manager.per_tenant}); end one (DELETE) "
                        "or let it expire"
                    },
                    status_code=429,
                    headers={"Retry-After": "30"},
                )
                await response(scope, receive, send)
                return
            if scope.get("method") == "DELETE":
                await _answered_after(inner, scope, receive, send)
                return
        await inner(scope, receive, send)

    return guarded, manager


async def _answered_after(app: Any, scope: Any, receive: Any, send: Any) -> None:
    """`app`'s answer, sent once `app` has returned: the SDK ends a session (and the service
    closes it, giving its quota place back) after it sent the DELETE's answer; a client that
    opens the next session on that answer must find the place free."""
    held: list[Any] = []

    async def hold(message: Any) -> None:
        held.append(message)

    try:
        await app(scope, receive, hold)
    finally:
        for message in held:
            await send(message)
