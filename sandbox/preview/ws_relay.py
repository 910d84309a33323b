"""A websocket carried to a sandbox's port over its agent's connection (docs/preview.md).

The `websockets` library speaks the protocol to the server in the sandbox (its sans-I/O client:
the bytes go over the PortStream); the browser's side is Starlette's WebSocket. The browser's
socket is accepted only once the server in the sandbox accepted the handshake, with the
subprotocol it chose. Messages are relayed whole, at most MAX_MESSAGE bytes each way; either
side closing closes the other, with its code.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

if TYPE_CHECKING:
    from sandbox.runtime.protocol import PortStream

MAX_MESSAGE = 4 << 20  # each way (uvicorn's ws_max_size for the browser's side: api/serving.py)
HANDSHAKE_TIMEOUT_S = 30.0


async def _flush(proto: ClientProtocol, stream: PortStream) -> None:
    data = b"".join(proto.data_to_send())
    if data:
        await stream.write(data)


async def relay(browser: WebSocket, stream: PortStream, *, port: int, target: str) -> None:
    """Open the websocket `target` on the sandbox's server, then relay both ways until one closes."""
    offered = [
        Subprotocol(p.strip()) for p in browser.headers.get("sec-websocket-protocol", "").split(",") if p.strip()
    ]
    proto = ClientProtocol(
        parse_uri(f"ws://localhost:{port}{target}"), subprotocols=offered or None, max_size=MAX_MESSAGE
    )
    request = proto.connect()
    # the browser's Origin is the service's, which a dev server's own check would refuse; its
    # cookies and the tenant's token are never the sandbox's to see
    if "user-agent" in browser.headers:
        request.headers["User-Agent"] = browser.headers["user-agent"]
    proto.send_request(request)
    await _flush(proto, stream)
    accepted = None
    early: list[Frame] = []  # frames that came with the handshake's answer (a server that speaks first)
    with anyio.move_on_after(HANDSHAKE_TIMEOUT_S):
        while accepted is None:
            data = await stream.read()
            if not data:
                break
            proto.receive_data(data)
            for event in proto.events_received():
                if isinstance(event, Response):
                    accepted = event
                elif isinstance(event, Frame):
                    early.append(event)
    if accepted is None or proto.state is not State.OPEN:
        await browser.close(code=1011, reason="the sandbox's server did not accept the websocket")
        return
    await browser.accept(subprotocol=proto.subprotocol)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_from_browser, browser, proto, stream, tg.cancel_scope)
        tg.start_soon(_from_sandbox, browser, proto, stream, tg.cancel_scope, early)


async def _from_browser(browser: WebSocket, proto: ClientProtocol, stream: PortStream, done: anyio.CancelScope) -> None:
    try:
        while True:
            message = await browser.receive()
            if message["type"] == "websocket.disconnect":
                if proto.state is State.OPEN:
                    proto.send_close(1000 if message.get("code") in (None, 1005, 1006) else int(message["code"]))
                break
            if message.get("text") is not None:
                proto.send_text(message["text"].encode())
            elif message.get("bytes") is not None:
                proto.send_binary(message["bytes"])
            await _flush(proto, stream)
    except WebSocketDisconnect:
        if proto.state is State.OPEN:
            proto.send_close()
    with contextlib.suppress(Exception):
        await _flush(proto, stream)
    done.cancel()


async def _from_sandbox(
    browser: WebSocket, proto: ClientProtocol, stream: PortStream, done: anyio.CancelScope, early: list[Frame]
) -> None:
    parts: list[bytes] = []
    kind = Opcode.TEXT
    code, reason = 1011, "the sandbox's server closed the connection"
    while True:
        ended = False
        if early:
            arrived: list[Any] = [*early]
            early.clear()
        else:
            data = await stream.read()
            ended = not data
            if ended:
                proto.receive_eof()
            else:
                proto.receive_data(data)
            arrived = list(proto.events_received())
        for frame in arrived:
            if not isinstance(frame, Frame):
                continue
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                kind, parts = frame.opcode, [bytes(frame.data)]
            elif frame.opcode is Opcode.CONT:
                parts.append(bytes(frame.data))
            else:
                continue  # pings are answered by the protocol; a close ends the loop below
            if sum(map(len, parts)) > MAX_MESSAGE:
                proto.fail(1009, "message too big")
                break
            if frame.fin:
                whole = b"".join(parts)
                parts = []
                if kind is Opcode.TEXT:
                    await browser.send_text(whole.decode(errors="replace"))
                else:
                    await browser.send_bytes(whole)
        await _flush(proto, stream)  # pongs, and the answer to a close
        if proto.state is State.CLOSED or ended:
            if proto.close_rcvd is not None:
                code, reason = proto.close_rcvd.code, proto.close_rcvd.reason
            break
    with contextlib.suppress(Exception):
        await browser.close(
            code=code if 1000 <= code < 5000 and code not in (1005, 1006) else 1000, reason=reason[:120]
        )
    done.cancel()
