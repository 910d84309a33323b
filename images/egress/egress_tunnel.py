"""What happens inside a CONNECT tunnel: a gate that reads the whole TLS ClientHello and checks
its SNI against the CONNECT host, then a relay with a cap on bytes and time.

Only TLS passes a tunnel: anything else (plain HTTP, whose Host header the proxy could not check,
or any other protocol) is refused. The gate decides itself, whatever the bytes look like: it never
hands the choice back to mitmproxy, whose own next-layer logic would intercept or pass through.
"""

from __future__ import annotations

from typing import Any

from egress_rules import is_ip, normal_host
from egress_secrets import intercepted
from egress_state import HELLO_TIMEOUT_S, MAX_BYTES, MAX_DURATION_S, MAX_HELLO_BYTES, emit, peer
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers import tcp
from mitmproxy.proxy.layers.tls import ClientTLSLayer, ServerTLSLayer, parse_client_hello
from mitmproxy.proxy.utils import expect


def tunnel_line(
    context: Any, host: str, port: int, verdict: str, reason: str, *, status: int = 200, up: int = 0, down: int = 0
) -> None:
    """The journal line of one tunnel event (opened, refused, closed, cut) of `context`'s client."""
    emit(
        client=peer(context.client),
        method="CONNECT",
        host=host,
        port=port,
        status=status,
        bytes_up=up,
        bytes_down=down,
        verdict=verdict,
        reason=reason,
    )


def sni_verdict(data: bytes, host: str) -> str | None:
    """ "wait" (the ClientHello is not complete), None (it names `host`), or why it is refused."""
    if not data:
        return "wait"
    if data[0] != 0x16:
        return "only TLS passes a tunnel (send plain HTTP to the proxy as a request, not through CONNECT)"
    try:
        hello = parse_client_hello(data)
    except ValueError:
        return "the TLS ClientHello is malformed"
    if hello is None:
        return "wait"
    sni = normal_host(hello.sni or "")
    if not sni:
        # clients send no SNI for an IP address; for a name its absence hides the real target
        return None if is_ip(host) else f"the TLS ClientHello names no host (SNI) for {host}"
    if sni != host:
        return f"TLS SNI {sni} differs from the CONNECT host {host}"
    return None


class TunnelGate(layer.Layer):
    """Holds a tunnel's first bytes until the whole ClientHello is there, then refuses or relays."""

    def __init__(self, context: Any, host: str, port: int) -> None:
        super().__init__(context)
        self.host, self.port = host, port
        self.buffer = bytearray()
        self.child: layer.Layer | None = None
        self.wakeup: commands.RequestWakeup | None = None
        self.closed = False

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        mine = isinstance(event, events.Wakeup) and event.command is self.wakeup
        if self.child is not None:
            if not mine:  # the hello deadline is the gate's own business, not the child's
                yield from self.child.handle_event(event)
            return
        if self.closed:
            return
        if isinstance(event, events.Start):
            self.wakeup = commands.RequestWakeup(HELLO_TIMEOUT_S)
            yield self.wakeup
        elif isinstance(event, events.Wakeup):
            if mine:
                yield from self._refuse(f"no complete TLS ClientHello within {HELLO_TIMEOUT_S:g} s")
        elif isinstance(event, events.DataReceived):
            if event.connection != self.context.client:
                yield from self._refuse("the server spoke before the client's TLS ClientHello")
                return
            self.buffer += event.data
            if len(self.buffer) > MAX_HELLO_BYTES:
                yield from self._refuse("the TLS ClientHello is too large")
                return
            reason = sni_verdict(bytes(self.buffer), self.host)
            if reason == "wait":
                return
            if reason is not None:
                yield from self._refuse(reason)
                return
            if intercepted(self.host):
                # a host that carries a secret: mitmproxy decrypts (with this proxy's own CA, which
                # only this sandbox trusts) so the secret can be put in; requests inside are checked
                server_tls = ServerTLSLayer(self.context)
                server_tls.child_layer = ClientTLSLayer(self.context)
                self.child = server_tls
                tunnel_line(
                    self.context,
                    self.host,
                    self.port,
                    "allowed",
                    "tunnel opened, decrypted (the host carries a secret)",
                )
            else:
                self.child = CappedTunnel(self.context, self.host, self.port)
            yield from self.child.handle_event(events.Start())
            yield from self.child.handle_event(events.DataReceived(self.context.client, bytes(self.buffer)))
        elif isinstance(event, events.ConnectionClosed):
            yield from self._refuse("closed before its TLS ClientHello", log=False)

    def _refuse(self, reason: str, *, log: bool = True) -> layer.CommandGenerator[None]:
        self.closed = True
        if log:
            tunnel_line(self.context, self.host, self.port, "refused", reason, status=0, up=len(self.buffer))
        yield commands.CloseConnection(self.context.client)
        if self.context.server.connected:
            yield commands.CloseConnection(self.context.server)


class CappedTunnel(tcp.TCPLayer):
    """A tunnel relayed as bytes (no interception), cut past the byte or time cap.

    It writes a line when it opens (so a tunnel still open when its sandbox goes is on record)
    and one when it ends, with the bytes each way and why it ended.
    """

    def __init__(self, context: Any, host: str, port: int) -> None:
        super().__init__(context, ignore=True)  # no flow: nothing is buffered or kept
        self.host, self.port = host, port
        self.up = self.down = 0
        self.verdict, self.reason = "closed", ""
        self.logged = False
        self.wakeup: commands.RequestWakeup | None = None
        self._handle_event = self.start  # the base class binds its own start at class level

    @expect(events.Start)
    def start(self, event: events.Event) -> layer.CommandGenerator[None]:
        tunnel_line(self.context, self.host, self.port, "allowed", "tunnel opened")
        self.wakeup = commands.RequestWakeup(MAX_DURATION_S)
        yield self.wakeup
        yield from super().start(event)

    @expect(events.DataReceived, events.ConnectionClosed, tcp.TcpMessageInjected, events.Wakeup)
    def relay_messages(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Wakeup):
            if event.command is self.wakeup:
                yield from self._cut(f"open longer than {MAX_DURATION_S:g} s")
            return
        if isinstance(event, events.DataReceived):
            if event.connection == self.context.client:
                self.up += len(event.data)
            else:
                self.down += len(event.data)
            if self.up + self.down > MAX_BYTES:
                yield from self._cut(f"more than {MAX_BYTES} bytes")
                return
        yield from super().relay_messages(event)
        if self._handle_event == self.done:
            self._log()

    @expect(events.DataReceived, events.ConnectionClosed, tcp.TcpMessageInjected, events.Wakeup)
    def done(self, _: events.Event) -> layer.CommandGenerator[None]:
        yield from ()

    def _cut(self, reason: str) -> layer.CommandGenerator[None]:
        self.verdict, self.reason = "cut", reason
        yield commands.CloseConnection(self.context.client)
        yield commands.CloseConnection(self.context.server)
        self._handle_event = self.done
        self._log()

    def _log(self) -> None:
        if not self.logged:
            self.logged = True
            tunnel_line(
                self.context,
                self.host,
                self.port,
                self.verdict,
                self.reason or "tunnel closed",
                up=self.up,
                down=self.down,
            )


class Closed(layer.Layer):
    """Closes a connection at once (what it would carry is not allowed here)."""

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Start):
            yield commands.CloseConnection(self.context.client)
            if self.context.server.connected:
                yield commands.CloseConnection(self.context.server)
