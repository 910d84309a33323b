"""sandbox.client without a service: refusals mapped to the library's codes, Retry-After, the
429 retry (httpx.MockTransport causes the 429s), the SSE parser, and a server that closes the
connection mid-stream (a raw loopback socket, fault injection)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox import ErrorCode, UsageError
from sandbox.client import (
    AsyncClient,
    AsyncClientSession,
    BatchCall,
    Client,
    NotFoundError,
    RateLimitedError,
    RetryPolicy,
    ServiceError,
    ServiceTransportError,
    SessionEvent,
    ToolSession,
)
from sandbox.client.errors import error_for, retry_after
from sandbox.client.wire import SSEParser, batch_body, session_path
from sandbox.engine.orchestrator import Session

RESULT = b'{"ok": true, "tool": "exec", "call_id": "c1", "trace_id": "t1", "output": {"exit_code": 0}}'


def both_sessions(library: Session, service: AsyncClientSession) -> list[ToolSession]:
    """Checked by mypy (scripts/check): the library's Session and the client's both are ToolSessions."""
    return [library, service]


def refusal(status: int, body: bytes, headers: dict[str, str] | None = None) -> ServiceError:
    response = httpx.Response(status, content=body, headers=headers, request=httpx.Request("GET", "http://s/v1/x"))
    return error_for(response, body)


def test_refusals_carry_the_librarys_codes() -> None:
    """A body's engine code wins; otherwise the status names the code; retryable follows the code."""
    assert refusal(400, b'{"detail": "bad batch", "code": "CONFLICT"}').code == ErrorCode.CONFLICT
    found = refusal(404, b'{"detail": "no agent"}')
    assert (
        isinstance(found, NotFoundError) and found.code == ErrorCode.INVALID_ARGUMENTS and found.message == "no agent"
    )
    limited = refusal(429, b'{"detail": "quota"}', {"Retry-After": "7"})
    assert isinstance(limited, RateLimitedError) and limited.retryable and limited.retry_after_s == 7.0
    stopping = refusal(503, b'{"detail": "stopping"}', {"Retry-After": "5"})
    assert stopping.code == ErrorCode.SERVICE_UNAVAILABLE and stopping.retryable and stopping.http_status == 503
    invalid = refusal(422, b'{"detail": [{"loc": ["body", "tool"], "msg": "missing"}]}')
    assert invalid.code == ErrorCode.INVALID_ARGUMENTS and invalid.details["problems"][0]["msg"] == "missing"
    assert refusal(502, b"<html>proxy</html>").code == ErrorCode.NETWORK_ERROR
    assert refusal(500, b"").code == ErrorCode.INTERNAL and not refusal(500, b"").retryable


@given(st.text(max_size=40))
def test_retry_after_never_raises(value: str) -> None:
    """Any header text is seconds >= 0 or None (a hostile proxy may send anything)."""
    found = retry_after(value)
    assert found is None or found >= 0


def test_retry_after_reads_seconds_and_dates() -> None:
    """Delta-seconds and an HTTP date (in the past: 0) are read; garbage is None."""
    assert retry_after("12") == 12.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert retry_after("soon") is None and retry_after(None) is None


def limited_then_ok(refusals: int) -> tuple[list[int], httpx.MockTransport]:
    """A transport that answers 429 (Retry-After: 0) `refusals` times, then a ToolResult."""
    seen: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        if len(seen) <= refusals:
            return httpx.Response(
                429, json={"detail": "tenants[0].quotas.max_calls_per_minute"}, headers={"Retry-After": "0"}
            )
        return httpx.Response(200, content=RESULT)

    return seen, httpx.MockTransport(answer)


def test_a_429_is_retried_until_it_passes() -> None:
    """Two 429s then 200: three requests, the ToolResult returned."""
    seen, transport = limited_then_ok(2)
    with Client("http://s", "t", transport=transport) as client:
        assert client.session("k").call("exec", {"command": "true"}).ok
    assert len(seen) == 3


def test_retries_are_bounded_and_can_be_turned_off() -> None:
    """attempts=1 raises the first 429; the default stops after three."""
    seen, transport = limited_then_ok(1)
    with (
        Client("http://s", "t", transport=transport, retry=RetryPolicy(attempts=1)) as client,
        pytest.raises(RateLimitedError),
    ):
        client.session("k").call("exec")
    assert len(seen) == 1
    seen, transport = limited_then_ok(10)
    with Client("http://s", "t", transport=transport) as client, pytest.raises(RateLimitedError):
        client.agents()
    assert len(seen) == 3


@pytest.mark.anyio
async def test_the_async_client_retries_too() -> None:
    """AsyncClient: one 429, then the answer."""
    seen: list[int] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        if len(seen) == 1:
            return httpx.Response(429, json={"detail": "q"}, headers={"Retry-After": "0"})
        return httpx.Response(200, content=RESULT)

    async with AsyncClient("http://s", "t", transport=httpx.MockTransport(answer)) as client:
        assert (await client.session("k").call("exec")).call_id == "c1"
    assert len(seen) == 2


def test_session_keys_are_escaped_in_paths() -> None:
    """A key's slashes and question marks cannot reach another route."""
    assert (
        session_path("agent:a:x/../../approvals?y", "calls")
        == "/v1/sessions/agent%3Aa%3Ax%2F..%2F..%2Fapprovals%3Fy/calls"
    )


def test_a_batch_with_computed_arguments_is_refused_before_sending() -> None:
    """Arguments made by a function of earlier results exist only in-process: a UsageError."""
    with pytest.raises(UsageError):
        batch_body([BatchCall("exec", lambda results: {"command": "true"})], "sequential", None)


def sse(*lines: str) -> list[SessionEvent]:
    parser = SSEParser()
    return [e for line in lines if (e := parser.feed(line)) is not None]


def test_sse_parser_skips_comments_and_splits_events() -> None:
    """Keep-alives are skipped; each blank line ends one event; kind-specific fields go to detail."""
    found = sse(
        ": connected",
        "",
        "event: queued",
        'data: {"kind": "queued", "call_id": "c", "tool": "exec", "elapsed_s": 0}',
        "",
        ": keep-alive",
        "",
        'data: {"kind": "output", "call_id": "c", "tool": "exec", "elapsed_s": 0.5, "text": "hi"}',
        "",
    )
    assert [(e.kind, e.detail) for e in found] == [("queued", {}), ("output", {"text": "hi"})]


@contextmanager
def closes_mid_stream() -> Iterator[str]:
    """A loopback server that starts an event stream, sends one event, and drops the connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            event = b'data: {"kind": "queued", "call_id": "c", "tool": "exec", "elapsed_s": 0}\n\n'
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            conn.sendall(head + b"%x\r\n%s\r\n" % (len(event), event))  # and no last chunk: cut off

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        thread.join(timeout=10)
        listener.close()


def test_a_stream_cut_mid_way_is_a_transport_error() -> None:
    """The events already sent arrive; then ServiceTransportError (NETWORK_ERROR, retryable)."""
    got: list[str] = []
    with (
        closes_mid_stream() as url,
        Client(url, "t") as client,
        client.session("k").events() as events,
        pytest.raises(ServiceTransportError) as raised,
    ):
        for event in events:
            got.append(event.kind)
    assert got == ["queued"]
    assert raised.value.code == ErrorCode.NETWORK_ERROR and raised.value.retryable


@pytest.mark.anyio
async def test_an_async_stream_cut_mid_way_is_a_transport_error() -> None:
    """The async stream ends the same way."""
    got: list[str] = []
    with closes_mid_stream() as url:
        async with AsyncClient(url, "t") as client, client.session("k").events() as events:
            with pytest.raises(ServiceTransportError):
                async for event in events:
                    got.append(event.kind)
    assert got == ["queued"]


def test_the_client_surface_is_explicit() -> None:
    """sandbox.client.__all__ is sorted and names only what exists."""
    import sandbox.client

    assert sandbox.client.__all__ == sorted(sandbox.client.__all__)
    assert all(hasattr(sandbox.client, name) for name in sandbox.client.__all__)
