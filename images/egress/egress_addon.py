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
import json
import os
import socket
import sys
import weakref
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from egress_rules import address_refusal, is_ip, normal_host
from egress_scrub import TooManyHits
from egress_secrets import SECRETS, Refused, ca_pem, carries_secret, misplaced, scrub, substitute, upstream_bundle
from egress_state import (
    EXEMPT,
    HOST,
    MAX_BYTES,
    MAX_DURATION_S,
    MAX_HEADER_BYTES,
    POLICY,
    RESOLVE_TIMEOUT_S,
    emit,
    host_refusal,
    peer,
)
from egress_tunnel import Closed, TunnelGate
from mitmproxy import ctx, http
from mitmproxy.net.http import url
from mitmproxy.proxy.layers.tls import ClientTLSLayer


def _refuse(flow: http.HTTPFlow, status: int, reason: str) -> None:
    flow.response = http.Response.make(
        status, f"egress refused: {reason}\n".encode(), {"Content-Type": "text/plain", "X-Egress-Verdict": "refused"}
    )
    flow.metadata["egress_logged"] = True
    emit(
        method=flow.request.method,
        host=flow.metadata.get("egress_host") or normal_host(flow.request.host),
        port=flow.request.port,
        status=status,
        bytes_up=0,
        bytes_down=0,
        verdict="refused",
        reason=reason,
        client=peer(flow.client_conn),
    )


def _connection_line(client: Any, verdict: str, reason: str) -> None:
    """The line of something that happened to a client connection, not to one request."""
    emit(
        method="-",
        host="-",
        port=0,
        status=0,
        bytes_up=0,
        bytes_down=0,
        verdict=verdict,
        reason=reason,
        client=peer(client),
    )


def _host_header_refusal(request: http.Request, target: str) -> str | None:
    """Why the Host header (HTTP/1) or :authority and host (HTTP/2) do not name the request target."""
    hosts = request.headers.get_all("host")
    if len(hosts) > 1:
        # a server or a front end may route by any one of them: only one, checked, is sent
        return f"the request carries {len(hosts)} Host headers"
    for header in {request.host_header, *hosts} - {None}:
        try:
            host, port = url.parse_authority(str(header), check=True)
        except ValueError:
            return f"the Host header {str(header)[:100]!r} is malformed"
        if normal_host(host) != target or (port is not None and port != request.port):
            return f"the Host header names {normal_host(host)}, not the request target {target}"
    return None


class Egress:
    """The addon: client check, host and address verdicts, SNI check, one log line per request."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # server connection id -> the host name it was asked for
        self.connecting: set[str] = set()  # clients whose CONNECT is being answered
        # client connection id -> the host its CONNECT named: what every request decrypted in
        # that tunnel must name, however often the proxy reconnects upstream
        self.tunnels: dict[str, str] = {}
        self.deadlines: dict[str, asyncio.TimerHandle] = {}  # client id -> its connection's time cap

    def client_connected(self, client: Any) -> None:
        # only the sandbox on this proxy's internal network is served
        subnet = POLICY.get("client_subnet")
        address = peer(client)
        if subnet and not _in(address, subnet):
            client.error = "not a client of this proxy"
            _connection_line(client, "refused", f"client {address} is not on the sandbox network")
            return
        # no connection outlives the time cap, whatever it carries (plain HTTP too: mitmproxy
        # cannot kill a flow in transit, so the client's connection is closed under it)
        self.deadlines[client.id] = asyncio.get_running_loop().call_later(MAX_DURATION_S, self._expire, client)

    def client_disconnected(self, client: Any) -> None:
        self.tunnels.pop(client.id, None)
        timer = self.deadlines.pop(client.id, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, client: Any) -> None:
        self.deadlines.pop(client.id, None)
        proxyserver = ctx.master.addons.get("proxyserver")
        # mitmproxy 8's connection table (the version Debian ships, which the image pins)
        handler = proxyserver._connections.get(("tcp", client.peername, client.sockname))
        if handler is None or handler.client not in handler.transports:
            return
        _connection_line(client, "cut", f"connection open longer than {MAX_DURATION_S:g} s")
        writer = handler.transports[handler.client].writer
        if writer is not None:
            writer.close()

    def http_connect(self, flow: http.HTTPFlow) -> None:
        reason = host_refusal(flow.request.host, flow.request.port)
        if reason:
            _refuse(flow, 403, reason)
        else:
            self.connecting.add(flow.client_conn.id)
            self.tunnels[flow.client_conn.id] = normal_host(flow.request.host)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.request.method == "CONNECT" or flow.response is not None:
            return
        request = flow.request
        header_bytes = sum(len(k) + len(v) + 4 for k, v in request.headers.fields)
        flow.metadata["egress_header_bytes"] = header_bytes
        if header_bytes > MAX_HEADER_BYTES:
            _refuse(flow, 431, f"request headers of {header_bytes} bytes are over {MAX_HEADER_BYTES}")
            return
        # in a decrypted tunnel (its host carries a secret) the target is the CONNECT host: the
        # request's own host is the pinned address, and its Host header must name that host
        # whatever its scheme: an absolute http:// URL sent inside the tunnel is still in it
        tunnel_host = self.tunnels.get(flow.client_conn.id)
        target = tunnel_host or normal_host(request.host)
        flow.metadata["egress_host"] = target
        reason = _host_header_refusal(request, target) or host_refusal(target, request.port)
        if reason is None and tunnel_host is not None:
            reason = _tunnel_request_refusal(request, tunnel_host)
        if reason:
            _refuse(flow, 403, reason)
            return
        length = request.headers.get("content-length", "0")
        if length.isdigit() and int(length) + header_bytes > MAX_BYTES:
            _refuse(flow, 413, f"request of {int(length) + header_bytes} bytes is over {MAX_BYTES}")
            return
        if tunnel_host is not None:
            flow.metadata["egress_tunnel"] = tunnel_host

    def request(self, flow: http.HTTPFlow) -> None:
        tunnel_host = flow.metadata.get("egress_tunnel")
        if tunnel_host is None or flow.response is not None:
            return
        # only over TLS the proxy itself set up (a secret never travels in clear text), only in the
        # secret's own header, and never where a server could echo it back
        reason = misplaced(tunnel_host, flow.request)
        if reason:
            _refuse(flow, 403, reason)
            return
        flow.metadata["egress_secrets"] = substitute(tunnel_host, flow.request.headers)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None and not flow.metadata.get("egress_logged"):
            # the verdict header is the proxy's word: a server cannot fake a refusal with it
            flow.response.headers.pop("X-Egress-Verdict", None)
        if flow.response is not None and flow.response.status_code == 101:
            # an upgraded connection (websocket, h2c) would leave the caps behind: wss:// goes
            # through a tunnel, where the caps hold
            flow.metadata["egress_logged"] = True
            emit(
                method=flow.request.method,
                host=flow.metadata.get("egress_host") or normal_host(flow.request.host),
                port=flow.request.port,
                status=101,
                bytes_up=0,
                bytes_down=0,
                verdict="refused",
                reason="protocol upgrades are not relayed (use wss:// or https://)",
                client=peer(flow.client_conn),
            )
            flow.kill()  # the connection closes: nothing of the upgraded protocol passes

    async def server_connect(self, data: Any) -> None:
        host, port = data.server.address
        name = normal_host(str(host))
        self.names[data.server.id] = name
        # a connect that fails upstream gets no disconnect hook: the name goes with the connection
        weakref.finalize(data.server, self.names.pop, data.server.id, None)
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
            self.names.pop(data.server.id, None)  # never opened: server_disconnected will not come
            if tunnel:
                self.tunnels.pop(data.client.id, None)  # no tunnel was opened
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
                    client=peer(data.client),
                )

    def server_disconnected(self, data: Any) -> None:
        self.names.pop(data.server.id, None)

    def next_layer(self, nextlayer: Any) -> None:
        context = nextlayer.context
        if _decrypted(context):
            # inside a tunnel this proxy decrypts: HTTP only (mitmproxy runs with rawtcp off);
            # TLS inside TLS would carry what no check here can see
            data = nextlayer.data_client()
            if data[:1] == b"\x16":
                nextlayer.layer = Closed(context)
            return
        if not _in_tunnel(context):
            return
        name = self.names.get(context.server.id)
        if name is None:
            # every tunnel's server went through server_connect: never fall back to its pinned
            # address (an IP, for which a ClientHello without SNI would pass)
            nextlayer.layer = Closed(context)
            return
        # decided here, always: mitmproxy's own next-layer logic (which runs after this hook)
        # would otherwise intercept TLS or pass bytes through unchecked
        nextlayer.layer = TunnelGate(context, name, int(context.server.address[1]))

    def response(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get("egress_logged") or flow.request.method == "CONNECT":
            return
        flow.metadata["egress_logged"] = True
        host = flow.metadata.get("egress_host") or normal_host(flow.request.host)
        verdict, reason = "allowed", ""
        try:
            if flow.response is not None and carries_secret(host):
                # a secret's host, decrypted or in clear text: its value (a server that echoes a
                # header, or hands out its own token) never reaches the sandbox
                scrub(host, flow.response)
        except Refused as exc:
            verdict, reason = "refused", str(exc)
        except TooManyHits:
            verdict, reason = "refused", "the response could not be checked for secrets (too many partial matches)"
        except Exception as exc:  # fail closed: an unchecked response never goes through
            verdict, reason = "refused", f"the response could not be checked for secrets ({exc.__class__.__name__})"
        finally:
            if verdict != "allowed" or flow.response is None:
                # whatever failed above: what goes to the sandbox is this refusal, not the response
                status = flow.response.status_code if flow.response is not None else 0
                flow.response = http.Response.make(
                    502,
                    f"egress refused: {reason or 'no response'}\n".encode(),
                    {"Content-Type": "text/plain", "X-Egress-Verdict": "refused"},
                )
                reason = f"{reason} (upstream status {status})"
                verdict = "refused"
            emit(
                method=flow.request.method,
                host=host,
                port=flow.request.port,
                status=flow.response.status_code,
                bytes_up=len(flow.request.raw_content or b"") + int(flow.metadata.get("egress_header_bytes", 0)),
                bytes_down=len(flow.response.raw_content or b""),
                verdict=verdict,
                reason=reason,
                injected=",".join(flow.metadata.get("egress_secrets") or []),
                client=peer(flow.client_conn),
            )

    def error(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get("egress_logged"):
            return
        flow.metadata["egress_logged"] = True
        message = str(flow.error.msg if flow.error else "")
        refused = "egress refused: " in message
        emit(
            method=flow.request.method,
            host=flow.metadata.get("egress_host") or normal_host(flow.request.host),
            port=flow.request.port,
            status=502 if refused else 0,
            bytes_up=0,
            bytes_down=0,
            verdict="refused" if refused else "error",
            reason=message.split("egress refused: ", 1)[1] if refused else message,
            client=peer(flow.client_conn),
        )

    def running(self) -> None:
        bundle = upstream_bundle()
        if bundle is not None:
            ctx.options.update(ssl_verify_upstream_trusted_ca=bundle)
        ready: dict[str, Any] = {"egress": 0, "ready": True}
        if SECRETS:
            ready["ca"] = ca_pem()  # public: what the sandbox must trust for the secrets' hosts
        print(json.dumps(ready), flush=True)


def _in(address: str, subnet: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(subnet, strict=False)
    except ValueError:
        return False


def _tunnel_request_refusal(request: http.Request, tunnel_host: str) -> str | None:
    """A request in a decrypted tunnel names the tunnel's host, in its Host header and in nothing
    else (an absolute URL naming another host would route there on a shared front end)."""
    if not request.host_header:
        return f"a request in the tunnel to {tunnel_host} must carry a Host header naming it"
    if request.authority:
        named, _ = url.parse_authority(request.authority, check=False)
        if normal_host(named) != tunnel_host:
            return f"the request line names {normal_host(named)}, not the tunnel's host {tunnel_host}"
    return None


def _decrypted(context: Any) -> bool:
    """Whether this is the inside of a tunnel this proxy decrypts (its host carries a secret)."""
    return any(isinstance(layer, ClientTLSLayer) for layer in context.layers)


def _in_tunnel(context: Any) -> bool:
    """Whether this decision is for the bytes after a CONNECT (not the proxy's first request)."""
    return len(context.layers) > 1 and context.server.address is not None


async def _resolve_checked(name: str, port: int) -> tuple[str, str | None]:
    """(an address to pin, None) when every address of `name` may be reached; else ("", why not)."""
    if is_ip(name):
        reason = address_refusal(name, EXEMPT, HOST)
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
        reason = address_refusal(address, EXEMPT, HOST)
        if reason:
            # one inward answer is enough to refuse: a name that points inward at all is not trusted
            return "", f"{name} resolves to a refused address: {reason}"
    return addresses[0], None


addons = [Egress()]
