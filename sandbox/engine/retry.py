"""Retries of the failures worth retrying, with exponential backoff and jitter (tenacity)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from tenacity import AsyncRetrying, RetryError, retry_if_exception, stop_after_attempt, wait_random_exponential

from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.spec import RetryPolicy

__all__ = ["RETRIED_CODES", "RetryPolicy", "with_retries"]

T = TypeVar("T")

# Only these are retried: a timeout, the network, rate limits, an unavailable service or sandbox.
RETRIED_CODES = frozenset(
    {
        ErrorCode.TIMEOUT,
        ErrorCode.NETWORK_ERROR,
        ErrorCode.RATE_LIMITED,
        ErrorCode.SERVICE_UNAVAILABLE,
        ErrorCode.SANDBOX_UNAVAILABLE,
    }
)


def _wait_first(policy: RetryPolicy) -> Any:
    # the first failure happened outside tenacity: back off before its first attempt too
    async def before(state: Any) -> None:
        if state.attempt_number == 1:
            await anyio.sleep(wait_random_exponential(multiplier=policy.base_s, max=policy.cap_s)(state))

    return before


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, SandboxError) and exc.code in RETRIED_CODES


async def with_retries(fn: Callable[[], Awaitable[T]], policy: RetryPolicy, *, tool: str) -> T:
    """Call `fn`, retrying retryable SandboxErrors per `policy`.

    Raises:
        SandboxError: the error itself when it is not retryable or there is one attempt;
            RETRY_EXHAUSTED, with the last error in its details, when every attempt failed.
    """
    if policy.attempts <= 1:
        return await fn()
    try:
        return await fn()  # the common case costs nothing: tenacity only after a retryable failure
    except SandboxError as exc:
        if not _retryable(exc):
            raise
        first = exc
    retrying = AsyncRetrying(
        retry=retry_if_exception(_retryable),
        stop=stop_after_attempt(policy.attempts - 1),
        before=_wait_first(policy),
        wait=wait_random_exponential(multiplier=policy.base_s, max=policy.cap_s),
        sleep=anyio.sleep,
        reraise=False,
    )
    try:
        return await retrying(fn)
    except RetryError as exc:
        last = exc.last_attempt.exception() or first
        assert isinstance(last, SandboxError)
        raise SandboxError(
            ErrorCode.RETRY_EXHAUSTED,
            f"{tool} failed {policy.attempts} times; last error {last.code}: {last.message}",
            attempts=policy.attempts,
            last_error={"code": last.code.value, "message": last.message, "details": last.details},
        ) from last
