"""The resident agent over Docker: an attached exec socket as the link's transport, and what
starts, asks about and kills agents through the engine (runtime/agent/transport.py's seams).

The socket is docker-py's raw one, read without a thread: non-blocking, woken by the event loop.
Without a TTY the engine multiplexes the exec's stdout and stderr on it, each chunk behind an
8-byte header of its own; the transport strips that, so the link sees the agent's stdout alone.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
from typing import TYPE_CHECKING, Any

import anyio
import docker.errors

from sandbox.runtime.agent.fifo_link import LinkRefused, offer_link, unwrapped, wants_link
from sandbox.runtime.agent.frames import STDERR_KEPT, FrameError
from sandbox.runtime.agent.link import AgentUnavailable
from sandbox.runtime.docker.exec import close_exec_socket, create_exec
from sandbox.runtime.docker.kill import kill_exec

if TYPE_CHECKING:
    from sandbox.runtime.agent.transport import AgentTransport
    from sandbox.runtime.docker.backend import DockerBackend

# docker's own multiplexing header of an attached stream without a TTY: stream, 0, 0, 0, size
DOCKER_HEAD = struct.Struct(">BxxxI")
DRAIN_READS = 16  # a life line's drain reads at most 1 MiB at once


class DockerDemux:
    """Splits an attached exec stream's bytes into the agent's stdout and its stderr."""

    def __init__(self) -> None:
        self._mux = bytearray()
        self.stderr = bytearray()  # the last STDERR_KEPT bytes, for the log

    def feed(self, data: bytes) -> bytes:
        """The stdout bytes of the complete chunks `data` ends; FrameError when the bytes are not
        docker's multiplexed stream."""
        self._mux += data
        out = bytearray()
        while len(self._mux) >= DOCKER_HEAD.size:
            stream, size = DOCKER_HEAD.unpack_from(self._mux)
            if stream not in (1, 2):
                raise FrameError(f"the stream is not docker's multiplexed output (stream byte {stream})")
            end = DOCKER_HEAD.size + size
            if len(self._mux) < end:
                break
            chunk = bytes(self._mux[DOCKER_HEAD.size : end])
            del self._mux[:end]
            if stream == 1:
                out += chunk
            else:
                self.stderr = (self.stderr + chunk)[-STDERR_KEPT:]
        return bytes(out)


class DockerExecStream:
    """An agent's attached exec socket (an AgentTransport)."""

    def __init__(self, sock: socket.socket, raw: Any, exec_id: str) -> None:
        self._sock = sock
        self._raw = raw  # docker-py's response objects, closed with the socket
        self.exec_id = exec_id
        self._demux = DockerDemux()

    @property
    def name(self) -> str:
        return self.exec_id

    @property
    def stderr(self) -> bytes:
        return bytes(self._demux.stderr)

    def drain(self) -> None:
        """Read what waits on the socket now into the stderr kept (only for a life line, whose
        frames go elsewhere: stdout bytes read here are dropped). Bounded: a sandbox writing
        without pause into the agent's stdout cannot keep the event loop here."""
        with contextlib.suppress(OSError, FrameError):
            for _ in range(DRAIN_READS):
                data = self._sock.recv(65536)
                if not data:
                    return
                self._demux.feed(data)

    async def receive(self, max_bytes: int) -> bytes:
        while True:
            await anyio.wait_readable(self._sock)
            try:
                data = self._sock.recv(max_bytes)
            except BlockingIOError:
                continue
            if not data:
                return b""
            out = self._demux.feed(data)
            if out:
                return out  # else only stderr or a part of a chunk came: read on

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = self._sock.send(view)
            except BlockingIOError:
                await anyio.wait_writable(self._sock)
                continue
            view = view[sent:]

    def send_nowait(self, data: bytes) -> int:
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0

    def ended(self) -> bool:
        poller = select.poll()  # not select(): a busy host has fds past 1024
        poller.register(self._sock, select.POLLIN)
        return bool(poller.poll(0)) and self._sock.recv(1, socket.MSG_PEEK) == b""

    def close(self) -> None:
        anyio.notify_closing(self._sock)  # a reader waiting on it wakes (ClosedResourceError)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        close_exec_socket(self._raw)


class DockerAgents:
    """Starts resident agents with `docker exec -i`, and kills them from the host (an AgentStarter)."""

    def __init__(self, backend: DockerBackend) -> None:
        self._backend = backend

    async def image_labels(self, image: str) -> dict[str, str] | None:
        def labels() -> dict[str, str] | None:
            try:
                return dict(self._backend.client.api.inspect_image(image)["Config"].get("Labels") or {})
            except docker.errors.ImageNotFound:
                return None

        return await self._backend.call("inspect image", labels)

    async def start(self, container_id: str, argv: list[str], user: str | None) -> AgentTransport:
        api = self._backend.client.api
        params = {"stdin": True, "stdout": True, "stderr": True, **({"user": user} if user else {})}
        exec_id = await create_exec(self._backend, container_id, argv, params)
        raw = await self._backend.call("start agent", api.exec_start, exec_id, socket=True)
        sock = getattr(raw, "_sock", None)
        if type(sock) is not socket.socket:  # TLS or ssh transports: not read without a thread
            close_exec_socket(raw)
            raise AgentUnavailable("the engine's transport is not a plain socket; the agent is not used")
        sock.setblocking(False)
        stream = DockerExecStream(sock, raw, exec_id)
        if not wants_link(argv):
            return stream
        try:  # its frames over FIFOs beside the engine, where this sandbox has a link folder
            return await offer_link(stream, await self._backend.links.place(container_id, user))
        except BaseException as exc:
            stream.close()
            with anyio.CancelScope(shield=True):
                await self.kill(container_id, stream)
            if isinstance(exc, LinkRefused | OSError | anyio.BrokenResourceError | anyio.ClosedResourceError):
                raise AgentUnavailable(f"the agent's link could not be set up: {exc!r}") from exc
            raise

    async def kill(self, container_id: str, transport: AgentTransport) -> None:
        stream = unwrapped(transport)
        if isinstance(stream, DockerExecStream):
            await self._backend.call("kill agent", kill_exec, self._backend.client.api, container_id, stream.exec_id)
