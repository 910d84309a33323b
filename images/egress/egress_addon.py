"""mitmproxy addon: one sandbox's egress policy, enforced where every connection leaves.

The policy comes from $EGRESS_POLICY (JSON, written by the orchestrator when it made this
proxy). Every outbound connection passes `server_connect`, the one choke point: the host must be
on the allowlist (and on the tenant's, when it has one), the port on the port list, and every
address the name resolves to must be public; the connection is then pinned to the address that
was checked, so a second DNS answer cannot point it inward. Plain HTTP requests are also checked
on their Host header; CONNECT tunnels on the TLS SNI, then relayed without interception, with a
cap on bytes and time. One JSON line per request goes to stdout: the orchestrator collects it
into its journal (`sandbox logs`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from egress_rules import address_refusal, host_allowed, is_ip, normal_host
from mitmproxy import http
from mitmproxy.net.tls import is_tls_record_magic
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers import tcp
from mitmproxy.proxy.layers.tls import parse_client_hello
from mitmproxy.proxy.utils import expect

POLICY: dict[str, Any] = json.loads(os.environ.get("EGRESS_POLICY") or "{}")
ALLOW: list[str] = list(POLICY.get("allow", []))
FLOOR: list[str] | None = POLICY.get("floor")  # the tenant's list; None: no tenant list
PORTS: set[int] = {int(p) for p in POLICY.get("ports", [80, 443])}
EXEMPT: list[str] = list(POLICY.get("allow_private", []))
MAX_BYTES: int = int(POLICY.get("max_bytes", 256 * 1024 * 1024))
MAX_DURATION_S: float = float(POLICY.get("max_duration_s", 300))
RESOLVE_TIMEOUT_S = 5.0
IDENTITY: dict[str, str] = {k: str(v) for k, v in POLICY.get("identity", {}).items()}
_seq = itertools.count(1)


def emit(**fields: Any) -> None:
    """One request, one line: the orchestrator reads lines that start with {"egress":."""
    line = {"egress": next(_seq), "ts": round(time.time(), 3), **IDENTITY, **fields}
    print(json.dumps(line, sort_keys=False), flush=True)


def host_refusal(host: str, port: int) -> str | None:
    """Why this (host, port) is off the policy, or None."""
    if port not in PORTS:
        return f"port {port} is not on the egress port list {sorted(PORTS)}"
    if not host_allowed(host, ALLOW):
        return f"host {normal_host(host)} is not on the egress allowlist"
    if FLOOR is not None and not host_allowed(host, FLOOR):
        return f"host {normal_host(host)} is not on the tenant's egress allowlist"
    return None


def _refuse(flow: http.HTTPFlow, status: int, reason: str) -> None:
    flow.response = http.Response.make(
        status, f"egress refused: {reason}\n".encode(), {"Content-Type": "text/plain", "X-Egress-Verdict": "refused"}
    )
    flow.metadata["egress_logged"] = True
    emit(
        method=flow.request.method,
        host=normal_host(flow.request.host),
        port=flow.request.port,
        status=status,
        bytes_up=0,
        bytes_down=0,
        verdict="refused",
        reason=reason,
    )


class CappedTunnel(tcp.TCPLayer):
    """A CONNECT tunnel relayed as bytes (no interception), closed past the byte or time cap."""

    def __init__(self, context: Any, host: str, port: int) -> None:
        super().__init__(context, ignore=True)  # no flow: nothing is buffered or kept
        self.host, self.port = host, port
        self.up = self.down = 0
        self.verdict, self.reason = "allowed", ""
        self.logged = False
        self._handle_event = self.start  # the base class binds its own start at class level

    @expect(events.Start)
    def start(self, event: events.Event) -> layer.CommandGenerator[None]:
        yield commands.RequestWakeup(MAX_DURATION_S)
        yield from super().start(event)

    @expect(events.DataReceived, events.ConnectionClosed, tcp.TcpMessageInjected, events.Wakeup)
    def relay_messages(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Wakeup):
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
            emit(
                method="CONNECT",
                host=self.host,
                port=self.port,
                status=200,
                bytes_up=self.up,
                bytes_down=self.down,
                verdict=self.verdict,
                reason=self.reason,
            )


class Refused(layer.Layer):
    """Closes a tunnel at once (its TLS SNI named another host)."""

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Start):
            yield commands.CloseConnection(self.context.client)
            if self.context.server.connected:
                yield commands.CloseConnection(self.context.server)


class Egress:
    """The addon: client check, host and address verdicts, SNI check, one log line per request."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # server connection id -> the host name it was asked for
        self.connecting: set[str] = set()  # clients whose CONNECT is being answered

    def client_connected(self, client: Any) -> None:
        # only the sandbox on this proxy's internal network is served
        subnet = POLICY.get("client_subnet")
        peer = client.peername[0] if client.peername else ""
        if subnet and not _in(peer, subnet):
            client.error = "not a client of this proxy"
            emit(
                method="-",
                host="-",
                port=0,
                status=0,
                bytes_up=0,
                bytes_down=0,
                verdict="refused",
                reason=f"client {peer} is not on the sandbox network",
            )

    def http_connect(self, flow: http.HTTPFlow) -> None:
        reason = host_refusal(flow.request.host, flow.request.port)
        if reason:
            _refuse(flow, 403, reason)
        else:
            self.connecting.add(flow.client_conn.id)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.request.method == "CONNECT" or flow.response is not None:
            return
        request = flow.request
        header = request.host_header
        if header is not None:
            named = normal_host(header.rsplit(":", 1)[0] if not header.startswith("[") else header.split("]")[0])
            if named != normal_host(request.host):
                _refuse(flow, 403, f"Host header {named} differs from the request target {normal_host(request.host)}")
                return
        reason = host_refusal(request.host, request.port)
        if reason:
            _refuse(flow, 403, reason)
            return
        length = request.headers.get("content-length", "0")
        if length.isdigit() and int(length) > MAX_BYTES:
            _refuse(flow, 413, f"request body of {length} bytes is over {MAX_BYTES}")

    async def server_connect(self, data: Any) -> None:
        host, port = data.server.address
        name = normal_host(str(host))
        self.names[data.server.id] = name
        # mitmproxy logs an exception in a hook and goes on connecting: every failure here refuses
        data.server.error = "egress refused: the verdict did not complete"
        try:
            reason = host_refusal(name, int(port))
            if reason is None:
                address, reason = await _resolve_checked(name, int(port))
                if reason is None:
                    data.server.address = (address, int(port))  # pinned: the address that was checked
                    data.server.error = None
        except Exception as exc:
            reason = f"the verdict failed ({exc.__class__.__name__})"
        tunnel = data.client.id in self.connecting
        self.connecting.discard(data.client.id)
        if reason is not None:
            data.server.error = f"egress refused: {reason}"
            if tunnel:  # a plain request's line is written by its `error` hook
                emit(
                    method="CONNECT",
                    host=name,
                    port=port,
                    status=502,
                    bytes_up=0,
                    bytes_down=0,
                    verdict="refused",
                    reason=reason,
                )

    def server_disconnected(self, data: Any) -> None:
        self.names.pop(data.server.id, None)

    def next_layer(self, nextlayer: Any) -> None:
        context = nextlayer.context
        if not _in_tunnel(context):
            return
        data = nextlayer.data_client()
        name = self.names.get(context.server.id, normal_host(str(context.server.address[0])))
        port = int(context.server.address[1])
        if is_tls_record_magic(data):
            try:
                hello = parse_client_hello(data)
            except ValueError:
                hello = None
                sni_reason: str | None = "the TLS ClientHello cannot be parsed"
            else:
                if hello is None:
                    nextlayer.layer = None  # wait for the whole ClientHello
                    return
                sni = normal_host(hello.sni or "")
                sni_reason = f"TLS SNI {sni} differs from the CONNECT host {name}" if sni and sni != name else None
            if sni_reason:
                emit(
                    method="CONNECT",
                    host=name,
                    port=port,
                    status=0,
                    bytes_up=0,
                    bytes_down=0,
                    verdict="refused",
                    reason=sni_reason,
                )
                nextlayer.layer = Refused(context)
                return
        elif len(data) < 3 and not nextlayer.data_server():
            nextlayer.layer = None
            return
        nextlayer.layer = CappedTunnel(context, name, port)

    def response(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get("egress_logged") or flow.request.method == "CONNECT":
            return
        flow.metadata["egress_logged"] = True
        emit(
            method=flow.request.method,
            host=normal_host(flow.request.host),
            port=flow.request.port,
            status=flow.response.status_code if flow.response else 0,
            bytes_up=len(flow.request.raw_content or b""),
            bytes_down=len(flow.response.raw_content or b"") if flow.response else 0,
            verdict="allowed",
            reason="",
        )

    def error(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get("egress_logged"):
            return
        flow.metadata["egress_logged"] = True
        message = str(flow.error.msg if flow.error else "")
        refused = "egress refused: " in message
        emit(
            method=flow.request.method,
            host=normal_host(flow.request.host),
            port=flow.request.port,
            status=502 if refused else 0,
            bytes_up=0,
            bytes_down=0,
            verdict="refused" if refused else "error",
            reason=message.split("egress refused: ", 1)[1] if refused else message,
        )

    def running(self) -> None:
        print(json.dumps({"egress": 0, "ready": True}), flush=True)


def _in(address: str, subnet: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(subnet, strict=False)
    except ValueError:
        return False


def _in_tunnel(context: Any) -> bool:
    """Whether this decision is for the bytes after a CONNECT (not the proxy's first request)."""
    return len(context.layers) > 1 and context.server.address is not None


async def _resolve_checked(name: str, port: int) -> tuple[str, str | None]:
    """(an address to pin, None) when every address of `name` may be reached; else ("", why not)."""
    if is_ip(name):
        reason = address_refusal(name, EXEMPT)
        return name, (f"{name} is not reachable: {reason}" if reason else None)
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(name, port, type=socket.SOCK_STREAM), timeout=RESOLVE_TIMEOUT_S)
    except (TimeoutError, OSError) as exc:
        return "", f"{name} does not resolve ({exc.__class__.__name__})"
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        return "", f"{name} does not resolve"
    for address in addresses:
        reason = address_refusal(address, EXEMPT)
        if reason:
            # one inward answer is enough to refuse: a name that points inward at all is not trusted
            return "", f"{name} resolves to a refused address: {reason}"
    return addresses[0], None


addons = [Egress()]
