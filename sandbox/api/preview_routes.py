"""Preview URLs: a web server a session started in its sandbox, shown through the service.

Two ways in, both carried to the sandbox's own loopback by its resident agent (preview/):
- `/v1/sessions/{key}/ports/{port}/...` with the tenant's bearer token (programs, HTTP and
  websockets);
- `/v1/previews/{link}/...`, a signed link that `POST /v1/sessions/{key}/preview-links` makes
  (people, in a browser). The link sits in the path, so a page's relative URLs carry it
  and no cookie is ever set on the service's host; it ends at its expiry, when the session's
  sandbox is gone, when the port leaves `sandbox.preview.ports`, or when the token that made it
  is revoked, and when the session is closed.

A page served this way is on the service's origin, where the approvals console lives: every
answer carries `Content-Security-Policy: sandbox` (an opaque origin: no script of the page can
read the console, the API or another preview), no Referer, and never a Set-Cookie.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

import anyio
import httpcore
from fastapi import FastAPI, HTTPException, Path, Request, WebSocket
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import HTTPConnection

from sandbox.api.auth import CallerDep, current_caller
from sandbox.api.bodies import mark_authenticated
from sandbox.api.requests import json_body, read_body
from sandbox.api.tenants import Caller, Tenants, bearer_token, token_hash
from sandbox.engine.orchestrator import Session
from sandbox.preview.access import Openings, PreviewRefused, check_port, running_sandbox_id
from sandbox.preview.closed import closed_since
from sandbox.preview.http_proxy import Upstream, request_headers, response_headers
from sandbox.preview.links import LinkRefused, PreviewLink, load_key, sign, verify
from sandbox.preview.ws_relay import relay

PortParam = Annotated[int, Path(ge=1, le=65535)]
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class LinkRequest(BaseModel):
    """`POST /v1/sessions/{key}/preview-links`: the port, and how long the link works (at most,
    and by default, the agent's `sandbox.preview.link_ttl_s`)."""

    model_config = ConfigDict(extra="forbid")
    port: int = Field(ge=1, le=65535)
    ttl_s: int | None = Field(None, ge=1)


class PreviewLinkOut(BaseModel):
    url: str  # the path to open on this service (it ends in /)
    session: str
    port: int
    expires_at: str


def add_preview_routes(
    app: FastAPI, tenants: Tenants, session_for: Callable[[HTTPConnection, Caller, str, str | None], Session]
) -> None:
    """Register the preview routes on `app`."""
    config = tenants.config
    openings = Openings()
    keys: list[bytes] = []

    def signing_key() -> bytes:
        if not keys:
            keys.append(load_key(config.service.preview_key_file, config.state_dir))
        return keys[0]

    def refused(exc: PreviewRefused) -> HTTPException:
        return HTTPException(exc.status, exc.message)

    # the body is read by hand, after the token: FastAPI reads a body parameter before it checks one
    @app.post("/v1/sessions/{key}/preview-links", response_model=PreviewLinkOut, openapi_extra=json_body(LinkRequest))
    async def make_link(
        request: Request, key: Annotated[str, Path(max_length=256)], agent: str | None = None
    ) -> PreviewLinkOut:
        """A signed link to the session's `port` for a browser (docs/preview.md): open
        `url` on this service. It works until `expires_at`, and ends sooner with the session."""
        who = await current_caller(request)
        body = await read_body(request, LinkRequest)
        port = body.port
        session = session_for(request, who, key, agent)
        try:
            check_port(session, port)
            made_for = await running_sandbox_id(session)
        except PreviewRefused as exc:
            raise refused(exc) from None
        most = session.agent.sandbox.preview.link_ttl_s
        ttl = most if body.ttl_s is None else body.ttl_s
        if ttl > most:
            raise HTTPException(
                400, f"ttl_s {ttl} is longer than {session.agent.key_path}.sandbox.preview.link_ttl_s ({most})"
            )
        expires = int(time.time() + ttl)
        token = bearer_token(request.headers.get("authorization")) or ""
        grant = PreviewLink(
            tenant=who.tenant.id,
            token=who.token_name,
            token_sha=token_hash(token)[:16],
            agent=session.agent.id,
            session=session.key,
            port=port,
            sandbox=made_for,
            issued=round(time.time(), 3),
            expires=expires,
        )
        await _journal_link(request, session, grant)
        return PreviewLinkOut(
            url=f"/v1/previews/{sign(signing_key(), grant)}/",
            session=session.key,
            port=port,
            expires_at=datetime.fromtimestamp(expires, UTC).isoformat(),
        )

    @app.api_route("/v1/sessions/{key}/ports/{port}/{path:path}", methods=METHODS, include_in_schema=False)
    async def session_port(request: Request, key: str, port: PortParam, path: str, who: CallerDep) -> Response:
        session = session_for(request, who, key, request.query_params.get("agent"))
        return await _proxy(request, session, port, made_for=None, prefix_parts=6)

    @app.api_route("/v1/previews/{link}/{path:path}", methods=METHODS, include_in_schema=False)
    async def preview(request: Request, link: str, path: str) -> Response:
        grant, session = _granted(request, link)
        mark_authenticated(request.scope)  # the link is this request's credential
        return await _proxy(request, session, grant.port, made_for=grant.sandbox, prefix_parts=4)

    @app.get("/v1/previews/{link}", include_in_schema=False)
    async def preview_root(request: Request, link: str) -> Response:
        _granted(request, link)
        return RedirectResponse(f"/v1/previews/{link}/", status_code=308)

    @app.get("/v1/sessions/{key}/ports/{port}", include_in_schema=False)
    async def session_port_root(key: str, port: PortParam, who: CallerDep) -> Response:
        return RedirectResponse(f"/v1/sessions/{quote(key, safe='')}/ports/{port}/", status_code=308)

    @app.websocket("/v1/sessions/{key}/ports/{port}/{path:path}")
    async def session_port_ws(websocket: WebSocket, key: str, port: int, path: str) -> None:
        who = tenants.from_authorization(websocket.headers.get("authorization"))
        if who is None:
            await websocket.close(code=1008, reason="a valid bearer token is required")
            return
        try:
            session = session_for(websocket, who, key, websocket.query_params.get("agent"))
        except HTTPException as exc:
            await websocket.close(code=1008, reason=str(exc.detail)[:120])
            return
        await _relay(websocket, session, port, made_for=None, prefix_parts=6)

    @app.websocket("/v1/previews/{link}/{path:path}")
    async def preview_ws(websocket: WebSocket, link: str, path: str) -> None:
        try:
            grant, session = _granted(websocket, link)
        except HTTPException as exc:
            await websocket.close(code=1008, reason=str(exc.detail)[:120])
            return
        await _relay(websocket, session, grant.port, made_for=grant.sandbox, prefix_parts=4)

    def _granted(request: Request | WebSocket, link: str) -> tuple[PreviewLink, Session]:
        """The grant of a link, and its session, while all it names still holds (401/404 otherwise)."""
        try:
            grant = verify(signing_key(), link)
        except LinkRefused as exc:
            raise HTTPException(401, str(exc)) from None
        who = tenants.holder(grant.tenant, grant.token, grant.token_sha)
        if who is None:
            raise HTTPException(401, "the token that made this link was revoked; ask for a new one")
        if closed_since(config.state_dir, grant.tenant, grant.session, grant.issued):
            raise HTTPException(410, "the session this link shows was closed; ask for a new one")
        return grant, session_for(request, who, grant.session, grant.agent)

    async def _proxy(
        request: Request, session: Session, port: int, *, made_for: str | None, prefix_parts: int
    ) -> Response:
        prefix, target = _split(request, prefix_parts)
        exits = AsyncExitStack()
        try:
            stream = await exits.enter_async_context(openings.port(session, port, made_for=made_for))
            upstream = Upstream(stream, port)
            exits.push_async_callback(upstream.aclose)
            headers = request_headers(
                request.headers.raw,
                port=port,
                prefix=prefix,
                host=request.headers.get("host", "").encode(),
                scheme=request.url.scheme,
            )
            has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
            if has_body and "content-length" not in request.headers:
                headers.append((b"transfer-encoding", b"chunked"))
            answer = await upstream.send(request.method, target, headers, request.stream() if has_body else None)
        except PreviewRefused as exc:
            await exits.aclose()
            raise refused(exc) from None
        except httpcore.TimeoutException:
            await exits.aclose()
            raise HTTPException(504, f"the server on port {port} did not answer in time") from None
        except (httpcore.ProtocolError, httpcore.NetworkError) as exc:
            await exits.aclose()
            raise HTTPException(502, f"the server on port {port} broke HTTP: {exc}") from None
        except BaseException:
            await exits.aclose()
            raise
        return _Streamed(answer.status, response_headers(answer.headers, answer.status), upstream.body(), exits)

    async def _relay(
        websocket: WebSocket, session: Session, port: int, *, made_for: str | None, prefix_parts: int
    ) -> None:
        _, raw_target = _split(websocket, prefix_parts)
        target = raw_target.decode(errors="replace")
        try:
            async with openings.port(session, port, made_for=made_for) as stream:
                await relay(websocket, stream, port=port, target=target)
        except PreviewRefused as exc:
            await websocket.close(code=1011 if exc.status >= 500 else 1008, reason=exc.message[:120])


def _split(connection: HTTPConnection, prefix_parts: int) -> tuple[str, bytes]:
    """The route's prefix (`/v1/previews/LINK`), and the target in the sandbox: the rest of the
    path as the client sent it (still percent-encoded) and the query."""
    raw = connection.scope.get("raw_path") or connection.url.path.encode()
    parts = raw.split(b"/", prefix_parts)
    prefix = b"/".join(parts[:prefix_parts]).decode(errors="replace")
    target = b"/" + (parts[prefix_parts] if len(parts) > prefix_parts else b"")
    if connection.url.query:
        target += b"?" + connection.url.query.encode()
    return prefix, target


async def _journal_link(request: Request, session: Session, grant: PreviewLink) -> None:
    """A link made is journaled (its session, port, sandbox and expiry; never its text)."""
    journal = request.app.state.orch.journal
    if journal is None:
        return
    data = {"port": grant.port, "sandbox": grant.sandbox[:12], "expires": grant.expires, "token": grant.token}
    await anyio.to_thread.run_sync(
        lambda: journal.append_note(
            ts=time.time(),
            call_id=f"preview-{grant.sandbox[:12]}-{grant.port}-{time.time_ns()}",
            session=session.key,
            tenant=grant.tenant,
            agent=grant.agent,
            tool="preview",
            seq=1,
            data=data,
        )
    )


class _Streamed(Response):
    """The sandbox server's answer, streamed; the connection closes when it ends or the client goes."""

    def __init__(
        self, status: int, headers: list[tuple[bytes, bytes]], body: AsyncIterator[bytes], exits: AsyncExitStack
    ) -> None:
        super().__init__(status_code=status)
        self.raw_headers = headers
        self._body = body
        self._exits = exits

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def client_gone() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(client_gone)
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                if scope["method"] != "HEAD":
                    async for chunk in self._body:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._exits.aclose()
