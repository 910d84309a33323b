"""One HTTP request carried to a sandbox's port over its agent's connection (docs/preview.md).

httpcore speaks HTTP/1.1 to the server in the sandbox over a PortStream (its network backend is
the tunnel, not a socket): the request's head and body go as they came, minus what must not
reach the sandbox (the caller's bearer token, cookies, hop-by-hop headers); the response comes
back streamed, minus what must not reach the browser from it (cookies for the service's host,
hop-by-hop headers), plus headers that keep the page away from the service's origin.
"""

# ruff: noqa: ASYNC109  (httpcore's network interface takes timeouts as arguments)
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import anyio
import httpcore

from sandbox.errors import SandboxError

if TYPE_CHECKING:
    from sandbox.runtime.protocol import PortStream

HEAD_TIMEOUT_S = 60.0  # a dev server's first page (a compile) may take a while
READ_IDLE_S = 60.0
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# never to the sandbox: the tenant's token, the browser's cookies for the service's host
NOT_FORWARDED = HOP_BY_HOP | {
    b"authorization",
    b"cookie",
    b"host",
    b"x-forwarded-for",
    b"x-forwarded-host",
    b"x-forwarded-proto",
    b"x-forwarded-prefix",
    b"forwarded",
}
# a page in a sandbox is shown as an opaque origin (no script of it can read the service's pages,
# the console's included, or another preview), never handed a Referer of its secret link, and
# never lets it set a cookie on the service's host
ISOLATION = (
    (b"content-security-policy", b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
)
# what the browser may get from the sandbox's server: an allowlist. Anything else may act on the
# service's whole origin or host (Set-Cookie, Clear-Site-Data, NEL and Report-To, HSTS, Alt-Svc,
# a Basic-auth prompt in the service's name), so it is dropped
RETURNED = frozenset(
    {
        b"accept-ranges",
        b"age",
        b"cache-control",
        b"date",
        b"etag",
        b"expires",
        b"last-modified",
        b"link",
        b"location",
        b"pragma",
        b"retry-after",
        b"server-timing",
        b"timing-allow-origin",
        b"vary",
        b"refresh",
        b"permissions-policy",
        b"content-security-policy",
        b"content-security-policy-report-only",
    }
)
RETURNED_PREFIXES = (b"content-", b"x-", b"access-control-", b"cross-origin-")
NOT_RETURNED = HOP_BY_HOP | {b"x-content-type-options"}  # (ours is added)


class _TunnelStream(httpcore.AsyncNetworkStream):
    def __init__(self, stream: PortStream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with anyio.move_on_after(timeout):
            try:
                return await self._stream.read(max_bytes)
            except SandboxError as exc:
                raise httpcore.ReadError(exc.message) from None
        raise httpcore.ReadTimeout(f"the sandbox's server sent nothing for {timeout} s")

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        with anyio.move_on_after(timeout) as scope:
            try:
                await self._stream.write(buffer)
            except SandboxError as exc:  # the server closed, or the agent went: httpcore's own error
                raise httpcore.WriteError(exc.message) from None
        if scope.cancelled_caught:
            raise httpcore.WriteTimeout(f"the sandbox's server took nothing for {timeout} s")

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("previews speak plain HTTP to the sandbox's loopback")

    def get_extra_info(self, info: str) -> Any:
        return None


class _TunnelBackend(httpcore.AsyncNetworkBackend):
    """A network whose one connection is the tunnel already open."""

    def __init__(self, stream: PortStream) -> None:
        self._stream = stream

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        return _TunnelStream(self._stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("no unix sockets")

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


def _named_by_connection(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    """The headers a `Connection` header names: hop-by-hop too, whatever they are called."""
    return {
        name.strip().lower() for k, v in headers if k.lower() == b"connection" for name in v.split(b",") if name.strip()
    }


def request_headers(
    headers: Iterable[tuple[bytes, bytes]], *, port: int, prefix: str, host: bytes, scheme: str
) -> list[tuple[bytes, bytes]]:
    """What the sandbox's server is told: the browser's headers, minus credentials and hop-by-hop
    ones, with Host `localhost:PORT` (what a dev server expects) and where it is shown."""
    given = list(headers)
    dropped = NOT_FORWARDED | _named_by_connection(given)
    kept = [(k, v) for k, v in given if k.lower() not in dropped]
    return [
        (b"host", f"localhost:{port}".encode()),
        *kept,
        (b"x-forwarded-host", host),
        (b"x-forwarded-proto", scheme.encode()),
        (b"x-forwarded-prefix", prefix.encode()),
    ]


def response_headers(headers: Iterable[tuple[bytes, bytes]], status: int) -> list[tuple[bytes, bytes]]:
    """What the browser is told: the server's headers that act on this answer alone (RETURNED),
    plus the isolation headers. A length goes only where it frames the body as sent: never with
    1xx, 204 or 304, nor beside a chunked encoding (httpcore took the chunks apart)."""
    given = list(headers)
    dropped = NOT_RETURNED | _named_by_connection(given)
    chunked = any(k.lower() == b"transfer-encoding" for k, _ in given)
    no_length = chunked or status < 200 or status in (204, 304)
    kept = []
    for k, v in given:
        name = k.lower()
        if name in dropped or not (name in RETURNED or name.startswith(RETURNED_PREFIXES)):
            continue
        if name == b"content-length" and no_length:
            continue
        kept.append((k, v))
    return kept + list(ISOLATION)


class Upstream:
    """One request sent to the sandbox's server; the answer's head, then its body streamed."""

    def __init__(self, stream: PortStream, port: int) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            network_backend=_TunnelBackend(stream), max_connections=1, retries=0, http1=True, http2=False
        )
        self._port = port
        self._response: httpcore.Response | None = None

    async def send(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: AsyncIterator[bytes] | None
    ) -> httpcore.Response:
        """Send the request; the response once its head arrived.

        Raises:
            httpcore.TimeoutException: no head within HEAD_TIMEOUT_S.
            httpcore.ProtocolError: the server's answer is not HTTP/1.1.
        """
        url = httpcore.URL(scheme=b"http", host=b"localhost", port=self._port, target=target)
        timeouts = {"connect": 10.0, "read": HEAD_TIMEOUT_S, "write": READ_IDLE_S, "pool": 10.0}
        request = httpcore.Request(
            method.encode(), url, headers=headers, content=body, extensions={"timeout": timeouts}
        )
        self._response = await self._pool.handle_async_request(request)
        return self._response

    async def body(self) -> AsyncIterator[bytes]:
        """The response's body, chunk by chunk."""
        assert self._response is not None
        stream = self._response.stream
        assert isinstance(stream, AsyncIterable)  # an async request's response
        async for chunk in stream:
            yield chunk

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            if self._response is not None:
                await self._response.aclose()
        with contextlib.suppress(Exception):
            await self._pool.aclose()
