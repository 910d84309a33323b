"""What the sync and async clients share: the requests each method makes, how answers become
models or exceptions, the 429 retry, and the server-sent-events parser. The two clients differ
only in how they send (httpx.Client or httpx.AsyncClient)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from tenacity import RetryCallState, retry_if_exception_type, stop_after_attempt

from sandbox.client.errors import NotFoundError, RateLimitedError, error_for
from sandbox.client.models import CallState, SessionEvent
from sandbox.engine.batch import BatchCall, BatchResult
from sandbox.errors import ErrorCode, UsageError
from sandbox.tools.spec import ErrorInfo, ToolResult

NEXT_CURSOR = "x-next-cursor"
# a call's answer arrives when its tool finishes (an exec may run for minutes, an approval waits
# for a human): no read timeout by default, a bounded connect
DEFAULT_TIMEOUT = httpx.Timeout(10.0, read=None)


@dataclass(frozen=True)
class RetryPolicy:
    """How a 429 is retried: at most `attempts` tries in all, each after the service's
    `Retry-After` (capped at `max_wait_s`; `default_wait_s` when it sent none).

    `attempts=1` turns retrying off: the first 429 raises RateLimitedError.
    """

    attempts: int = 3
    max_wait_s: float = 60.0
    default_wait_s: float = 1.0

    def tenacity(self) -> dict[str, Any]:
        """The arguments of tenacity's Retrying/AsyncRetrying for this policy."""

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            after = exc.retry_after_s if isinstance(exc, RateLimitedError) else None
            return min(self.max_wait_s, self.default_wait_s if after is None else after)

        return {
            "retry": retry_if_exception_type(RateLimitedError),
            "stop": stop_after_attempt(max(1, self.attempts)),
            "wait": wait,
            "reraise": True,  # the last RateLimitedError itself, not tenacity's RetryError
        }


DEFAULT_RETRY = RetryPolicy()


def path(*parts: str) -> str:
    """A route path with each part percent-encoded (a session key holds colons, maybe slashes)."""
    return "/".join(quote(p, safe="") if i else p for i, p in enumerate(parts))


def session_path(key: str, *rest: str) -> str:
    """`/v1/sessions/{key}/...`."""
    return path("/v1/sessions", key, *rest)


def params(**values: Any) -> dict[str, Any]:
    """Query parameters without the ones left unset."""
    return {k: v for k, v in values.items() if v is not None}


def checked(response: httpx.Response) -> httpx.Response:
    """`response` when it is a success, else the ServiceError for it (its body must have been read)."""
    if response.is_success:
        return response
    raise error_for(response, response.content)


def key_headers(idempotency_key: str | None) -> dict[str, str]:
    """The `Idempotency-Key` header of a call (none without a key)."""
    return {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}


MAX_WAIT_S = 60.0  # the longest long-poll the service allows (`GET /v1/calls/{id}?wait=`)


def submit_headers(idempotency_key: str | None) -> dict[str, str]:
    """The headers of a submitted call: answered at once with its handle (RFC 7240)."""
    return {"Prefer": "respond-async", **key_headers(idempotency_key)}


def submitted_id(response: httpx.Response) -> str:
    """The call id of a `202 Accepted` (its `Location`, or the body's `call_id`)."""
    location = response.headers.get("Location", "")
    return location.rsplit("/", 1)[1] if location else str(response.json()["call_id"])


def call_state(response: httpx.Response) -> CallState:
    """`GET /v1/calls/{id}`'s answer."""
    return CallState.model_validate_json(response.content)


def ended_result(found: CallState) -> ToolResult | None:
    """The ToolResult of an ended call (an abandoned one's is its reason as a CONFLICT, as the
    library's handle says); None while it runs."""
    if found.state == "finished":
        return found.result
    if found.state != "abandoned":
        return None
    error = ErrorInfo(code=ErrorCode.CONFLICT.value, message=f"the call was abandoned: {found.reason}")
    return ToolResult(ok=False, tool=found.tool, call_id=found.call_id, trace_id="", error=error)


def call_body(
    tool: str, arguments: Mapping[str, Any] | None, agent: str | None, approved: str | None = None
) -> dict[str, Any]:
    """The body of `POST /v1/sessions/{key}/calls` (and of an approval check, without `approved`)."""
    return params(agent=agent, approved=approved) | {"tool": tool, "args": dict(arguments or {})}


def batch_body(calls: Iterable[BatchCall], mode: str, agent: str | None) -> dict[str, Any]:
    """The body of `POST /v1/sessions/{key}/batches`, from the library's own BatchCall.

    Raises:
        UsageError: a call's arguments are a function of earlier results (the library runs those; the service cannot).
    """
    items = []
    for c in calls:
        if callable(c.arguments):  # arguments made from earlier results run in-process only
            raise UsageError(f"batch call {c.id or c.name!r}: arguments made by a function cannot go to the service")
        items.append({"id": c.id, "tool": c.name, "args": dict(c.arguments or {}), "depends_on": list(c.depends_on)})
    return params(agent=agent) | {"mode": mode, "calls": items}


def tool_result(response: httpx.Response) -> ToolResult:
    """A call's answer: the ToolResult, also when the tool failed (its `error` says how)."""
    return ToolResult.model_validate_json(checked(response).content)


def batch_result(response: httpx.Response) -> BatchResult:
    """A batch's answer as the library's BatchResult."""
    data = checked(response).json()
    return BatchResult(
        status=data["status"],
        results=[ToolResult.model_validate(r) for r in data["results"]],
        failed=list(data["failed"]),
    )


class SSEParser:
    """Server-sent events, fed line by line: comments (the keep-alives) are skipped, a blank line
    ends an event. Only what the service sends is handled: one `event:` and one `data:` line."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> SessionEvent | None:
        """The event `line` completes, if it completes one."""
        if line.startswith(":"):
            return None
        if line == "":
            data, self._data = self._data, []
            return SessionEvent.from_data(json.loads("\n".join(data))) if data else None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None  # `event:` repeats the JSON's kind; `id:`/`retry:` the service never sends


def not_pending(approval_id: str) -> NotFoundError:
    """What `approval(id)` raises for an id the tenant has no pending approval of (like the service's 404)."""
    return NotFoundError(ErrorCode.INVALID_ARGUMENTS, f"no pending approval {approval_id!r}", status=404)
