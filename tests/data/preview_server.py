"""A web server a sandboxed session starts (tests/test_preview_docker.py): pages, an echo of what
it was sent, a large body, a cookie it tries to set, and a websocket echo. Standard library only
(the sandbox image has no other): the websocket is spoken by hand, text frames only."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def answer(
        self, status: int, body: bytes, kind: str = "text/html", extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/ws"):
            self.websocket()
        elif self.path.startswith("/big"):
            n = int(self.path.partition("n=")[2] or "0")
            self.answer(200, (b"0123456789abcdef" * (n // 16 + 1))[:n], "application/octet-stream")
        elif self.path.startswith("/echo"):
            seen = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
            self.answer(200, json.dumps(seen).encode(), "application/json")
        else:
            page = b"<!doctype html><title>preview</title><h1>preview ok</h1><a href='echo'>echo</a>"
            self.answer(200, page, extra=(("Set-Cookie", "sbx_console=forged; Path=/ui"), ("X-App", "1")))

    do_HEAD = do_GET

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        seen = {"length": len(body), "sha256": hashlib.sha256(body).hexdigest(), "path": self.path}
        self.answer(201, json.dumps(seen).encode(), "application/json")

    def websocket(self) -> None:
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        # it speaks first, in the same write as its answer (as a dev server's "connected" does)
        self._headers_buffer.append(b"\r\n\x81\x05hello")  # type: ignore[attr-defined]
        self.flush_headers()
        sock = self.rfile
        while True:
            head = sock.read(2)
            if len(head) < 2:
                return
            opcode, size = head[0] & 0x0F, head[1] & 0x7F
            if size == 126:
                size = struct.unpack(">H", sock.read(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", sock.read(8))[0]
            mask = sock.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(sock.read(size)))
            if opcode == 8:
                self.wfile.write(b"\x88\x02\x03\xe8")
                self.wfile.flush()
                return
            reply = b"echo:" + data
            n = len(reply)
            if n < 126:
                frame = b"\x81" + bytes([n])
            elif n < 65536:
                frame = b"\x81\x7e" + struct.pack(">H", n)
            else:
                frame = b"\x81\x7f" + struct.pack(">Q", n)
            self.wfile.write(frame + reply)
            self.wfile.flush()


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
