"""What the agent link speaks over, and what starts an agent: the two seams an engine fills in.

A transport is one duplex byte stream to one agent process: its stdin one way, its stdout (the
frames) the other, its stderr kept aside for the log. It only moves bytes; frames, request ids,
timeouts and what a hostile agent may do are the link's (runtime/agent/link.py). Implemented by
Docker's attached exec socket (runtime/docker/agent_stream.py, which strips the engine's stream
header), by two FIFOs beside the engine with that socket as the life line
(runtime/agent/fifo_link.py), and by a local subprocess's pipes (runtime/agent/pipe.py, for
tests without an engine).
A Kubernetes pods/exec websocket (v5.channel.k8s.io) fits the same shape: `send` is a channel-0
message, `receive` returns channel-1 payloads (channel 2 goes to `stderr`, channel 3's status
ends the stream), and `close` sends CLOSE `[255, 0]` for stdin before closing the socket.
"""

from __future__ import annotations

from typing import Protocol


class AgentTransport(Protocol):
    """One agent's byte stream. Used by one link; at most one `receive` and one `send` at once."""

    @property
    def name(self) -> str:
        """What the logs call this stream (an exec id, a pid)."""
        ...

    @property
    def stderr(self) -> bytes:
        """The end of what the agent wrote to its stderr so far (a traceback), for the log."""
        ...

    async def receive(self, max_bytes: int) -> bytes:
        """The next bytes of the agent's stdout, waiting for them; b"" once the stream ended.

        Raises:
            anyio.ClosedResourceError: the stream was closed (by `close`) while waiting.
            OSError: the stream failed.
            ValueError: the bytes broke the transport's own framing (a hostile or foreign stream).
        """
        ...

    async def send(self, data: bytes) -> None:
        """Write all of `data` to the agent's stdin, waiting while it is not reading.

        Raises:
            anyio.ClosedResourceError or anyio.BrokenResourceError: closed while waiting.
            OSError: the stream failed.
        """
        ...

    def send_nowait(self, data: bytes) -> int:
        """Write what of `data` the stream takes now, without waiting; how many bytes (0 where the
        stream cannot tell without waiting). Raises as :meth:`send` does."""
        ...

    def ended(self) -> bool:
        """Whether the stream is already known to have ended, without waiting or consuming bytes
        (only asked while nobody is in `receive`). False when unsure."""
        ...

    def close(self) -> None:
        """End the stream (the agent sees its stdin end and exits); a waiting `receive` or
        `send` wakes with ClosedResourceError. Called once."""
        ...


class AgentStarter(Protocol):
    """What an engine does for the resident agents of its sandboxes: starts, kills, asks."""

    async def image_labels(self, image: str) -> dict[str, str] | None:
        """The labels of `image` (they say whether it carries the agent); None: no such image."""
        ...

    async def start(self, container_id: str, argv: list[str], user: str | None) -> AgentTransport:
        """Start `argv` (the agent) in the sandbox as `user`, attached to a new transport.

        Raises:
            SandboxGone: the sandbox is gone or stopped (nothing ran).
            AgentUnavailable: this engine's stream cannot carry the link.
        """
        ...

    async def kill(self, container_id: str, transport: AgentTransport) -> None:
        """Make sure the agent behind a dead link's `transport` is gone (a stopped or lying agent
        must not linger)."""
        ...
