"""Connections of the service: a request head arrives within `service.head_timeout_s`, and its
body within `service.body_timeout_s` of the head's end, or the connection is closed (a tenant
that trickles its bodies a byte a second held its connections forever); open connections are
bounded (in all, per client address, and those that have not yet presented a valid token) below
the process's file-descriptor limit.

uvicorn has neither a request-head timeout nor a per-address bound (its keep-alive timer runs
only between requests, and `limit_concurrency` answers 503 to everyone alike), so the service
runs uvicorn with its own HTTP protocol class: uvicorn's httptools protocol plus a guard (see
ConnectionGuard for which connection goes first when a bound is reached). A stranger's idle
connections therefore cannot keep a tenant out: the tenant's new connection pushes out the
stranger's oldest, and once it has authenticated it is no longer a candidate while a stranger's
idle connection is left.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from sandbox._log import logger
from sandbox.api.bodies import CONNECTION
from sandbox.config.models import ServiceSection

FD_RESERVE = 256  # descriptors kept for everything else (the journal, the engine's sockets, exec streams); at most half
MAX_HEAD_BYTES = 64 * 1024  # a request line and headers larger than this are refused
STALL_S = 1.0  # an unauthenticated connection idle this long is the first to go (at most head_timeout/2)


@dataclass(frozen=True)
class EdgeLimits:
    """The bounds one server enforces (see `limits_of`)."""

    head_timeout_s: float
    max_connections: int
    per_address: int
    unauthenticated: int
    unauthenticated_per_address: int
    body_timeout_s: float = 30.0


def limits_of(service: ServiceSection, nofile: int | None = None) -> EdgeLimits:
    """The configured bounds, each kept below the file-descriptor limit (`nofile`: the soft
    RLIMIT_NOFILE, read when not given) minus FD_RESERVE (or half of it, when it is small)."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY:
        ceiling = service.max_connections
    else:
        ceiling = max(8, nofile - min(FD_RESERVE, nofile // 2))
    total = min(service.max_connections, ceiling)
    return EdgeLimits(
        head_timeout_s=service.head_timeout_s,
        body_timeout_s=service.body_timeout_s,
        max_connections=total,
        per_address=min(service.max_connections_per_address, total),
        unauthenticated=min(service.max_unauthenticated_connections, total),
        unauthenticated_per_address=min(service.max_unauthenticated_per_address, total),
    )


class Conn:
    """One open connection as the guard sees it."""

    __slots__ = ("address", "authenticated", "close", "idle_for")

    def __init__(self, address: str, idle_for: Callable[[], float], close: Callable[[], None]) -> None:
        self.address = address
        self.authenticated = False  # set by the app (bodies.mark_authenticated) once a token checked
        self.idle_for = idle_for  # seconds without a request being served (-1: one is being served)
        self.close = close


class ConnectionGuard:
    """The open connections of one server, oldest first, and the bounds they are held to.

    The unauthenticated bounds are soft: past one, the oldest *stalled* stranger (idle for
    STALL_S: no complete head yet, or nothing asked since its last answer) of the address (or of
    all) is closed, and when there is none the new connection is let in all the same (a burst of
    honest new connections from one address, each about to send its request, must not push each
    other out). The per-address and total bounds are hard: past one, the oldest idle stranger,
    however young, is closed, else a tenant's idle keep-alive connection, else the new one is
    refused.
    """

    def __init__(self, limits: EdgeLimits) -> None:
        self.limits = limits
        self._open: dict[Conn, None] = {}  # insertion order: oldest first
        self.refused = 0
        self.evicted = 0

    def admit(self, new: Conn) -> bool:
        """Make room for `new` (closing idle strangers) and count it in; False: refused."""
        lim = self.limits
        stall_s = min(STALL_S, lim.head_timeout_s / 2)
        strangers = [c for c in self._open if not c.authenticated]
        if sum(1 for c in strangers if c.address == new.address) >= lim.unauthenticated_per_address:
            self._evict(lambda c: c.address == new.address, stall_s, strangers_only=True)
        if len(strangers) >= lim.unauthenticated:
            self._evict(lambda c: True, stall_s, strangers_only=True)
        same = sum(1 for c in self._open if c.address == new.address)
        for full, where in (
            (same >= lim.per_address, lambda c: c.address == new.address),
            (len(self._open) >= lim.max_connections, lambda c: True),
        ):
            if full and not self._evict(where, 0.0, strangers_only=False):
                self.refused += 1
                logger.bind(address=new.address, open=len(self._open)).warning("connection_refused")
                return False
        self._open[new] = None
        return True

    def _evict(self, where: Callable[[Conn], bool], idle_s: float, *, strangers_only: bool) -> bool:
        # strangers first; a tenant's idle keep-alive connection only when there is no stranger
        for authenticated in (False,) if strangers_only else (False, True):
            for c in self._open:
                if c.authenticated == authenticated and where(c) and c.idle_for() >= idle_s:
                    self.forget(c)
                    c.close()
                    self.evicted += 1
                    return True
        return False

    def forget(self, conn: Conn) -> None:
        """A connection closed."""
        self._open.pop(conn, None)

    def count(self) -> int:
        """Connections open now."""
        return len(self._open)


def guarded_websocket(guard: ConnectionGuard) -> type[WebSocketsSansIOProtocol]:
    """uvicorn's websocket protocol (previews' websockets, api/preview_routes.py) still counted
    by `guard`: an upgraded connection keeps its place until it closes. Its other bounds are
    uvicorn's: pings every 20 s (a peer that does not answer in 20 s is closed), messages of at
    most 16 MiB, no compression (serving.py)."""

    class GuardedWebSocket(WebSocketsSansIOProtocol):
        guard_conn: Conn | None = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self.guard_conn is not None:
                guard.forget(self.guard_conn)
                self.guard_conn = None
            super().connection_lost(exc)

    return GuardedWebSocket


def guarded_protocol(guard: ConnectionGuard) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol held to `guard`, with a request-head timeout."""

    class GuardedProtocol(HttpToolsProtocol):
        _conn: Conn | None = None
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None  # from the head's end to the body's last byte
        _awaiting_head = True
        _draining = False  # answered before its body was read: the rest is discarded, for a while
        _head_bytes = 0
        _idle_since = 0.0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else ""
            self._idle_since = self.loop.time()
            self._conn = Conn(address, self._idle_for, transport.close)
            if not guard.admit(self._conn):
                self._conn = None
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._conn is not None:
                guard.forget(self._conn)
            self._disarm()
            self._body_done()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self) -> None:
            conn, self._conn = self._conn, None  # the connection is the websocket's from now on
            self._disarm()
            self._body_done()
            super().handle_websocket_upgrade()
            upgraded = self.transport.get_protocol()
            if conn is None:
                return
            conn.idle_for = lambda: -1.0  # in use while open: never closed as an idle one
            if hasattr(upgraded, "guard_conn"):
                upgraded.guard_conn = conn
            else:
                guard.forget(conn)

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _idle_for(self) -> float:
            return self.loop.time() - self._idle_since if self._idle() else -1.0

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(guard.limits.head_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._head_timer = None
            stalled = (self._awaiting_head and self._idle()) or self._draining
            if stalled and not self.transport.is_closing():
                logger.bind(address=self._conn.address if self._conn else "").info("connection_head_timeout")
                self.transport.close()

        def _body_late(self) -> None:
            # the body did not arrive in time (trickled, or never sent): the connection goes, and
            # the request reading it sees a disconnect (its client is not answered: it is not
            # sending either)
            self._body_timer = None
            if not self.transport.is_closing():
                logger.bind(address=self._conn.address if self._conn else "").info("connection_body_timeout")
                self.transport.close()

        def _body_done(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def data_received(self, data: bytes) -> None:
            if self._awaiting_head and self._head_timer is None:  # a new request after a keep-alive pause
                self._arm()
            super().data_received(data)
            # counted only while the head is still incomplete after this chunk (one read may
            # carry a whole head and the start of a large body)
            if self._awaiting_head and self.parser is not None:
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[CONNECTION] = self._conn  # type: ignore[literal-required]

        def on_headers_complete(self) -> None:
            self._awaiting_head = False
            self._head_bytes = 0
            self._disarm()
            self._body_done()
            self._body_timer = self.loop.call_later(guard.limits.body_timeout_s, self._body_late)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._body_done()
            super().on_message_complete()
            if self._draining:
                self._draining = False
                self._awaiting_head = True
                self._arm()

        def on_response_complete(self) -> None:
            message_done = self.cycle is None or not self.cycle.more_body
            self._idle_since = self.loop.time()
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if message_done:
                self._awaiting_head = True  # uvicorn's keep-alive timer runs until the next byte
            else:
                self._draining = True  # the client may read the answer; the rest of its body goes
                self._arm()

    return GuardedProtocol


def protocol_for(service: ServiceSection) -> tuple[type[Any], type[Any], ConnectionGuard]:
    """The HTTP and websocket protocol classes to give uvicorn (`http=`, `ws=`) and the guard
    both report to."""
    guard = ConnectionGuard(limits_of(service))
    return guarded_protocol(guard), guarded_websocket(guard), guard
