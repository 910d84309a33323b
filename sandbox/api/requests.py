"""What the service accepts: the bodies of calls and batches (their size limit: api/bodies.py)."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import ClientDisconnect

M = TypeVar("M", bound=BaseModel)


class CallRequest(BaseModel):
    """`POST /v1/sessions/{key}/calls`."""

    model_config = {"extra": "forbid"}

    agent: str | None = Field(None, description="The agent; default: the key's, else the tenant's default.")
    tool: str = Field(min_length=1, max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)
    approved: str | None = Field(
        None,
        max_length=300,
        description="Approved by the caller, who asked a human first (an agent framework's own pause): "
        "a call that needs approval is journaled approved with this reason and does not wait. "
        "The tenant may decide its own approvals anyway (POST /v1/approvals/{id}/approve).",
    )


class ApprovalCheck(BaseModel):
    """`POST /v1/sessions/{key}/approval-check`: would this call wait for a human?"""

    model_config = {"extra": "forbid"}

    agent: str | None = None
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


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI `requestBody` of a route that reads its body with `read_body`."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


async def read_body(request: Request, model: type[M]) -> M:
    """The request's JSON body as `model`, checked in one step by pydantic's JSON parser; a bad
    body is FastAPI's usual 422. For the hot route: FastAPI's own body parsing and dependency
    solving cost it about a quarter of a millisecond.

    Raises:
        RequestValidationError: not JSON, or not a `model`.
    """
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if kind != "application/json" and not kind.endswith("+json"):
        raise RequestValidationError(
            [{"type": "model_attributes_type", "loc": ("body",), "msg": f"the body must be JSON, not {kind}"}]
        )
    try:
        raw = await request.body()
    except ClientDisconnect:  # gone before its body arrived: nobody reads the answer (FastAPI: 400)
        raise HTTPException(400, "the client went away before its body arrived") from None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        # without the input: a body that is not JSON would be echoed whole (and may not be UTF-8)
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False, include_input=False)]
        raise RequestValidationError(errors) from None


class ErrorBody(BaseModel):
    """Every refusal that is not a tool result: 400, 401, 403, 404, 409, 413, 429 and 503."""

    detail: str = Field(description="What was refused and why, in words a client (or a model) can act on.")
    code: str | None = Field(None, description="The error code, when the refusal is one of the engine's.")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (400, "a malformed request (an invalid session key, a bad batch)"),
        (401, "no valid bearer token"),
        (403, "an unsandboxed session this tenant may not reach"),
        (404, "not this tenant's (or does not exist)"),
        (409, "the approval was decided already"),
        (413, "the body is over the size limit"),
        (429, "a tenant quota (see Retry-After)"),
        (503, "the service is stopping (see Retry-After)"),
    )
}
