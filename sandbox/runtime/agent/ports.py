"""A connection to a port on a sandbox's own loopback, carried by its resident agent.

Previews (sandbox/preview/) reach a web server a sandboxed command started without giving the
sandbox any network: the agent connects to 127.0.0.1:PORT inside the sandbox and relays the
bytes as frames on the stream it already has (images/sandbox/sandbox_agent.py, PortRelay).

Both directions have a window: at most PORT_WINDOW bytes are sent and not yet acknowledged, so
a fast server and a slow reader (or the other way round) hold at most that much in memory. What
the agent sends is hostile input: data past the window, an acknowledgement of bytes never sent
or an answer out of turn ends the link like any other broken frame (runtime/agent/link.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from sandbox.errors import PortUnreachable
from sandbox.runtime.agent.frames import PortAck, PortClosed, PortData, PortFrame, PortOpened, PortRefused

if TYPE_CHECKING:
    from sandbox.runtime.agent.link import AgentLink

PORT_WINDOW = 256 << 10  # the agent's own (sandbox_agent.py PORT_WINDOW)
FRAME_BYTES = 64 << 10
OPEN_TIMEOUT_S = 10.0


class PortTunnel:
    """One open connection: read what the server sends, write to it, close it."""

    def __init__(self, link: AgentLink, rid: int, port: int) -> None:
        self._link = link
        self.id = rid
        self.port = port
        self.opened = False
        self.refused: PortRefused | None = None
        self.ended = False  # the server closed its side (or the link died)
        self._inbox = bytearray()
        self._owed = 0  # received, not yet acknowledged to the agent (what its window counts)
        self._in_flight = 0  # written to the agent, not yet acknowledged
        self._closed = False

    # -- what the link dispatches -----------------------------------------------------------

    def on_frame(self, frame: PortFrame, payload: bytes) -> str | None:
        """Take one frame for this tunnel; a reason to end the link when it breaks the protocol."""
        if isinstance(frame, PortOpened | PortRefused):
            if self.opened or self.refused is not None:
                return f"the agent answered port request {self.id} twice"
            if isinstance(frame, PortOpened):
                self.opened = True
            else:
                self.refused = frame
            return None
        if not self.opened:
            return f"the agent sent {frame.t!r} for port request {self.id} before it was open"
        if isinstance(frame, PortData):
            self._owed += len(payload)
            if self._owed > PORT_WINDOW:
                return f"the agent sent more than the {PORT_WINDOW}-byte window on port request {self.id}"
            self._inbox += payload
        elif isinstance(frame, PortAck):
            if frame.n > self._in_flight:
                return f"the agent acknowledged {frame.n} bytes on port request {self.id}, {self._in_flight} were sent"
            self._in_flight -= frame.n
        elif isinstance(frame, PortClosed):
            self.ended = True
        return None

    # -- what its user calls ------------------------------------------------------------------

    async def read(self, max_bytes: int = FRAME_BYTES) -> bytes:
        """What the server sent next; b"" once it closed its side and all was read.

        Raises:
            AgentUnavailable: the link died meanwhile.
        """
        await self._link.wait_port(lambda: bool(self._inbox) or self.ended)
        data = bytes(self._inbox[:max_bytes])
        del self._inbox[: len(data)]
        if data and not self._closed:
            self._owed -= len(data)
            await self._link.send_port({"t": "pack", "id": self.id, "n": len(data)})
        return data

    async def write(self, data: bytes) -> None:
        """Send `data` to the server, waiting while the window is full.

        Raises:
            PortUnreachable: the server closed the connection.
            AgentUnavailable: the link died meanwhile.
        """
        view = memoryview(data)
        while view:
            await self._link.wait_port(lambda: self._in_flight < PORT_WINDOW or self.ended)
            if self.ended or self._closed:
                raise PortUnreachable("closed", f"the server on port {self.port} closed the connection")
            room = min(PORT_WINDOW - self._in_flight, FRAME_BYTES, len(view))
            self._in_flight += room
            await self._link.send_port({"t": "pdata", "id": self.id}, bytes(view[:room]))
            view = view[room:]

    async def aclose(self) -> None:
        """Close the connection (the agent closes its socket); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._link.forget_port(self.id)
        if not self.ended:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await self._link.send_port({"t": "pclose", "id": self.id}, quiet=True)
        self.ended = True

    async def __aenter__(self) -> PortTunnel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
