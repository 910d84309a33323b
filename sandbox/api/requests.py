"""What the service accepts: the bodies of calls and batches, and a body-size limit."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

MAX_BODY_BYTES = 40 * 1024 * 1024


class CallRequest(BaseModel):
    """`POST /v1/sessions/{key}/calls`."""

    model_config = {"extra": "forbid"}

    agent: str | None = Field(None, description="The agent; default: the key's, else the tenant's default.")
    tool: str = Field(min_length=1, max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)


class BatchItem(BaseModel):
    """One call of a batch."""

    model_config = {"extra": "forbid"}

    id: str = Field("", max_length=64)
    tool: str = Field(min_length=1, max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[str] = []


class BatchRequest(BaseModel):
    """`POST /v1/sessions/{key}/batches`."""

    model_config = {"extra": "forbid"}

    agent: str | None = None
    mode: Literal["parallel", "sequential"] = "parallel"
    calls: list[BatchItem] = Field(min_length=1, max_length=64)


class BodyLimit:
    """413 for a body declared larger than MAX_BODY_BYTES, before it is read.

    Plain ASGI (not BaseHTTPMiddleware, which hides a client's disconnect from the endpoint).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            length = headers.get(b"content-length")
            if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
                response = JSONResponse({"detail": f"the body is larger than {MAX_BODY_BYTES} bytes"}, status_code=413)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
