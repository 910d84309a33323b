"""The client's exceptions: the library's codes and `retryable`, plus the HTTP status.

A tool that fails is not an exception here either: the service answers 200 with a ToolResult
whose `error` carries the code. What raises is what the service refused before any tool ran
(auth, tenancy, quotas, a malformed request, the service stopping) and what the network did.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx

from sandbox.errors import ErrorCode, SandboxError

# a refusal without an engine code is mapped by its status, the way the library would name it:
# another tenant's session is an unknown agent there (UsageError: INVALID_ARGUMENTS)
_CODE_OF_STATUS: dict[int, ErrorCode] = {
    400: ErrorCode.INVALID_ARGUMENTS,
    401: ErrorCode.PERMISSION_DENIED,
    403: ErrorCode.PERMISSION_DENIED,
    404: ErrorCode.INVALID_ARGUMENTS,
    408: ErrorCode.TIMEOUT,
    409: ErrorCode.CONFLICT,
    413: ErrorCode.INVALID_ARGUMENTS,
    422: ErrorCode.INVALID_ARGUMENTS,
    429: ErrorCode.RATE_LIMITED,
    502: ErrorCode.NETWORK_ERROR,
    503: ErrorCode.SERVICE_UNAVAILABLE,
    504: ErrorCode.TIMEOUT,
    507: ErrorCode.QUOTA_EXCEEDED,
}


class ServiceError(SandboxError):
    """The service refused a request (or could not be reached); never a tool's own failure.

    Args:
        code: the library's code for it (from the body's `code`, else from the status).
        message: the service's `detail`, or what the network did.
        status: the HTTP status, None when no answer arrived.
        retry_after_s: the service's `Retry-After`, in seconds, when it sent one.
        **details: structured context.
    """

    def __init__(
        self, code: ErrorCode, message: str, *, status: int | None, retry_after_s: float | None = None, **details: Any
    ) -> None:
        super().__init__(code, message, **details)
        self.status = status
        self.retry_after_s = retry_after_s

    @property
    def http_status(self) -> int:
        """The status the service answered (the code's own status when none arrived)."""
        return self.status if self.status is not None else super().http_status


class AuthenticationError(ServiceError):
    """401: no valid bearer token (wrong, revoked, or another scheme)."""


class NotFoundError(ServiceError):
    """404: not this tenant's, or does not exist (the service does not say which, on purpose)."""


class RateLimitedError(ServiceError):
    """429: a tenant quota; `retry_after_s` says when to try again (the client already did)."""


class ServiceTransportError(ServiceError):
    """No complete answer: the connection failed, timed out, or closed mid-stream (NETWORK_ERROR, retryable)."""


def retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # str.isdigit alone passes "¹", which float() refuses
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_for(response: httpx.Response, body: bytes) -> ServiceError:
    """The exception for a refusal (`body`: the response's bytes, already read)."""
    status = response.status_code
    detail: Any = None
    code: ErrorCode | None = None
    try:
        data = httpx.Response(status, content=body).json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        detail = data.get("detail")
        if isinstance(data.get("code"), str) and data["code"] in ErrorCode.__members__:
            code = ErrorCode(data["code"])
    if code is None:
        code = _CODE_OF_STATUS.get(status, ErrorCode.INTERNAL if status >= 500 else ErrorCode.INVALID_ARGUMENTS)
    # FastAPI's 422 is a list of problems: keep them as details, say the first in words
    first = detail[0] if isinstance(detail, list) and detail and isinstance(detail[0], dict) else {}
    message = (
        detail
        if isinstance(detail, str)
        else str(first["msg"])
        if isinstance(first.get("msg"), str)
        else f"HTTP {status} from {response.request.url.path}"
    )
    extra: dict[str, Any] = {"problems": detail} if isinstance(detail, list) else {}
    kind = {401: AuthenticationError, 404: NotFoundError, 429: RateLimitedError}.get(status, ServiceError)
    return kind(code, message, status=status, retry_after_s=retry_after(response.headers.get("retry-after")), **extra)


def transport_error(exc: httpx.TransportError) -> ServiceTransportError:
    """A network failure as NETWORK_ERROR (retryable), raised `from` the httpx exception."""
    return ServiceTransportError(
        ErrorCode.NETWORK_ERROR, f"no complete answer from the service: {type(exc).__name__}: {exc}", status=None
    )
