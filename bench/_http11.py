"""A lean HTTP/1.1 keep-alive client (h11 over one blocking loopback socket), so a benchmark
measures the service's cost and not an HTTP client library's: httpx spends 1-2 ms of its own
per request on this machine, more than the service adds."""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

import h11


class Http11:
    """One keep-alive connection to `url`; `request` returns (status, body)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self._host = parts.netloc
        self._sock = socket.create_connection((parts.hostname, parts.port or 80))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._headers = [("host", self._host), *headers.items()]
        self._conn = h11.Connection(h11.CLIENT)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else b""
        headers = [*self._headers, ("content-length", str(len(data)))]
        if body is not None:
            headers.append(("content-type", "application/json"))
        out = self._conn.send(h11.Request(method=method, target=path, headers=headers))
        out += self._conn.send(h11.Data(data=data)) if data else b""
        out += self._conn.send(h11.EndOfMessage())
        self._sock.sendall(out)
        status, chunks = 0, []
        while True:
            event = self._conn.next_event()
            if event is h11.NEED_DATA:
                self._conn.receive_data(self._sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._conn.start_next_cycle()
                return status, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the service closed the connection")

    def close(self) -> None:
        self._sock.close()
