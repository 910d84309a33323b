"""Retry policy with fake handlers (pure, fast)."""

from __future__ import annotations

import pytest

from sandbox.engine.retry import RetryPolicy, with_retries
from sandbox.errors import ErrorCode, SandboxError

pytestmark = pytest.mark.anyio
FAST = RetryPolicy(max_attempts=3, base_s=0.001, cap_s=0.002)


def failing(codes: list[ErrorCode], value: str = "ok"):  # type: ignore[no-untyped-def]
    calls: list[int] = []

    async def fn() -> str:
        calls.append(1)
        if len(calls) <= len(codes):
            raise SandboxError(codes[len(calls) - 1], f"fail {len(calls)}")
        return value

    return fn, calls


async def test_retryable_error_then_success() -> None:
    """A retryable failure is retried and the later success returned."""
    fn, calls = failing([ErrorCode.SANDBOX_UNAVAILABLE, ErrorCode.NETWORK_ERROR])
    assert await with_retries(fn, FAST, tool="t") == "ok" and len(calls) == 3


async def test_non_retryable_error_raised_at_once() -> None:
    """PERMISSION_DENIED (and other non-retryable codes) are not retried."""
    fn, calls = failing([ErrorCode.PERMISSION_DENIED])
    with pytest.raises(SandboxError) as info:
        await with_retries(fn, FAST, tool="t")
    assert info.value.code == ErrorCode.PERMISSION_DENIED and len(calls) == 1


async def test_exhausted_carries_last_error() -> None:
    """After the last attempt: RETRY_EXHAUSTED with the last error."""
    fn, calls = failing([ErrorCode.TIMEOUT] * 5)
    with pytest.raises(SandboxError) as info:
        await with_retries(fn, FAST, tool="web_fetch")
    assert info.value.code == ErrorCode.RETRY_EXHAUSTED and len(calls) == 3
    assert info.value.details["last_error"]["code"] == "TIMEOUT"
    assert "web_fetch failed 3 times" in info.value.message


async def test_side_effect_tools_not_retried_unless_idempotent() -> None:
    """A non-idempotent tool gets one attempt; its error comes back as is."""
    fn, calls = failing([ErrorCode.SANDBOX_UNAVAILABLE])
    with pytest.raises(SandboxError) as info:
        await with_retries(fn, RetryPolicy(idempotent=False), tool="exec")
    assert info.value.code == ErrorCode.SANDBOX_UNAVAILABLE and len(calls) == 1
