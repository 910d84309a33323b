"""Request bodies at the edge: none is read before its request is authenticated, and none past
MAX_BODY_BYTES, whether its size is declared or not (a chunked body is counted as it arrives).

Both hold for every route because they sit in `receive` itself (plain ASGI, wrapping the whole
app): a route or a library that reads the body early (FastAPI parses a body parameter before it
solves the auth dependency) gets a refusal instead of the bytes.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse

MAX_BODY_BYTES = 40 * 1024 * 1024
AUTHENTICATED = "sandbox.authenticated"  # scope key: set once the request's token was checked
CONNECTION = "sandbox.connection"  # scope key: the connection's record (api/connections.py)


def mark_authenticated(scope: Any) -> None:
    """Let the request's body through, and count its connection as a tenant's (not a stranger's)."""
    scope[AUTHENTICATED] = True
    conn = scope.get(CONNECTION)
    if conn is not None:
        conn.authenticated = True


def too_large() -> HTTPException:
    """The 413 of a body past the limit."""
    return HTTPException(413, f"the body is larger than {MAX_BODY_BYTES} bytes")


def unauthenticated() -> HTTPException:
    """The 401 of a request without a valid token."""
    return HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})


class _Refusal:
    """What one request's wrapped receive decided (the answer replaces whatever the app sends)."""

    def __init__(self) -> None:
        self.error: HTTPException | None = None
        self.sent = False  # the app started a response before any refusal


class BodyLimit:
    """413 for a body declared larger than MAX_BODY_BYTES before it is read, and as soon as a
    body without a declared size passes it; 401 for a body read before the request's token was
    checked. Plain ASGI (not BaseHTTPMiddleware, which hides a client's disconnect from the
    endpoint)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            await _answer(scope, receive, send, too_large())
            return
        refusal = _Refusal()
        received = 0

        async def counted() -> Any:
            nonlocal received
            if refusal.error is not None:
                raise refusal.error
            message = await receive()
            if message["type"] == "http.request" and message.get("body"):
                if not scope.get(AUTHENTICATED):
                    refusal.error = unauthenticated()
                    raise refusal.error
                received += len(message["body"])
                if received > MAX_BODY_BYTES:
                    refusal.error = too_large()
                    raise refusal.error
            return message

        async def answered(message: Any) -> None:
            if refusal.error is None or refusal.sent:
                refusal.sent = refusal.sent or message["type"] == "http.response.start"
                await send(message)
            # else: the app answers after a refusal (a library that caught it as its own 400 or
            # 500): the refusal's own answer is sent instead, below

        try:
            await self.app(scope, counted, answered)
        except Exception:
            if refusal.error is None or refusal.sent:
                raise
        if refusal.error is not None and not refusal.sent:
            refusal.sent = True
            await _answer(scope, receive, send, refusal.error)


async def _answer(scope: Any, receive: Any, send: Any, error: HTTPException) -> None:
    response = JSONResponse({"detail": error.detail}, status_code=error.status_code, headers=error.headers)
    await response(scope, receive, send)
