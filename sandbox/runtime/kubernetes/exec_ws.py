"""The agent link's transport on Kubernetes: one `pods/exec` websocket (`v5.channel.k8s.io`).

Every websocket message is one channel byte and its payload (apimachinery's wsstream): 0 the
agent's stdin, 1 its stdout (the frames), 2 its stderr, 3 one `Status` when the command ended,
and in v5 `[255, ch]` closes a channel. The server's messages are hostile input like the
agent's frames: a message is bounded (`max_message_bytes`, so a 1 GB announcement fails at its
header), unknown channels end the stream, and the status is parsed defensively.

`v5` is offered first and `v4` second. An API server since 1.30 answers v5 itself; an older
one (or a proxy) lets the kubelet answer v4, which cannot close stdin: the stream then ends
only by closing the socket, which is also how the agent is told to exit (the kubelet closes
its stdin). `protocol` says which was agreed; `explain` shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import aiohttp
import anyio

from sandbox.errors import ErrorCode, SandboxError
from sandbox.runtime.agent.frames import STDERR_KEPT

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, STATUS, RESIZE = 0, 1, 2, 3, 4
CLOSE = 255
# a server message past this ends the stream: API servers send output in chunks of about 32 KiB,
# and a link holds at most one message besides its buffer (hundreds of links stay small)
MAX_MESSAGE_BYTES = 1024 * 1024
SEND_CHUNK = 256 * 1024
_CLOSING: set[asyncio.Task[None]] = set()  # closing handshakes under way (a task needs a reference)


async def closed_streams(timeout_s: float = 5.0) -> None:
    """Wait (a bounded while) for the closing handshakes `ExecTransport.close` started: a session
    closed under them would leave connections behind."""
    if _CLOSING:
        await asyncio.wait(set(_CLOSING), timeout=timeout_s)


class ExecRefused(SandboxError):
    """The API server refused the exec (RBAC, a missing Pod, an unknown container)."""

    def __init__(self, status: int, message: str, **details: Any) -> None:
        code = ErrorCode.SANDBOX_UNAVAILABLE
        super().__init__(code, message, status=status, **details)
        self.status = status


def exec_url(base: str, namespace: str, pod: str, argv: Sequence[str], container: str = "sandbox") -> str:
    """The websocket URL of `argv` run in `pod` (stdin, stdout and stderr attached, no tty)."""
    query = [("command", arg) for arg in argv]
    query += [("container", container), ("stdin", "true"), ("stdout", "true"), ("stderr", "true"), ("tty", "false")]
    root = base.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return f"{root}/api/v1/namespaces/{namespace}/pods/{pod}/exec?{urlencode(query)}"


def exit_code_of(status: Mapping[str, Any]) -> int | None:
    """The command's exit code from the status channel's `Status` (client-go's errorDecoderV4):
    0 on Success, the `ExitCode` cause on NonZeroExitCode, None when the server failed otherwise."""
    if status.get("status") == "Success":
        return 0
    details = status.get("details")
    causes = details.get("causes") if status.get("reason") == "NonZeroExitCode" and isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            text = cause.get("message")
            if isinstance(text, str) and re.fullmatch(r"[0-9]{1,3}", text) and int(text) <= 255:
                return int(text)
    return None


async def upgrade(
    session: aiohttp.ClientSession,
    url: str,
    what: str,
    resource: str,
    *,
    protocols: Sequence[str],
    headers: Mapping[str, str] | None,
    ssl: Any,
    heartbeat_s: float | None,
    max_message_bytes: int,
) -> aiohttp.ClientWebSocketResponse:
    """A websocket of the API server's (`what`: exec, port forward; `resource`: what the Role must
    grant for it), its refusal as ExecRefused naming the fix.

    Raises:
        ExecRefused: the server answered the upgrade with an error status (403: the orchestrator
            may not `get` and `create` `resource` in that namespace; 404: no such Pod).
        OSError / aiohttp.ClientError: the server could not be reached.
    """
    try:
        return await session.ws_connect(
            url,
            protocols=tuple(protocols),
            headers=dict(headers or {}),
            heartbeat=heartbeat_s,
            max_msg_size=max_message_bytes,
            autoclose=False,
            ssl=ssl if ssl is not None else True,
        )
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status == 403:
            message = (
                f"the API server refused the {what} (403): the orchestrator's service account needs "
                f"`get` and `create` on `{resource}` in the sandbox's namespace (sandbox k8s render prints the Role)"
            )
        elif exc.status == 404:
            message = f"the API server has no such Pod or container to {what} (404)"
        else:
            message = f"the API server refused the {what} websocket ({exc.status} {exc.message})"
        raise ExecRefused(exc.status, message) from exc


async def open_exec(
    session: aiohttp.ClientSession,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    heartbeat_s: float | None = 30.0,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    protocols: Sequence[str] = (V5, V4),
    ssl: Any = None,
) -> ExecTransport:
    """Open the exec websocket and wait for the server's first (empty) message.

    Raises:
        ExecRefused: the server answered the upgrade with an error status (403: the orchestrator
            may not `get` and `create` `pods/exec` in that namespace; 404: no such Pod).
        OSError / aiohttp.ClientError: the server could not be reached.
    """
    ws = await upgrade(
        session,
        url,
        "exec",
        "pods/exec",
        protocols=protocols,
        headers=headers,
        ssl=ssl,
        heartbeat_s=heartbeat_s,
        max_message_bytes=max_message_bytes,
    )
    if ws.protocol not in (V5, V4):  # none agreed, or one not offered: its framing is unknown
        await ws.close()
        raise ExecRefused(0, f"the exec websocket agreed to {ws.protocol or 'no subprotocol'}, not {V5} or {V4}")
    return ExecTransport(ws)


class ExecTransport:
    """One exec websocket as an AgentTransport (runtime/agent/transport.py)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self.protocol = ws.protocol or ""
        self._stdout = bytearray()
        self._stderr = bytearray()
        self.status: dict[str, Any] | None = None
        self._ended = False
        self._closed = False
        self._send_lock = anyio.Lock()

    @property
    def name(self) -> str:
        return f"exec-ws({self.protocol or 'none'})"

    @property
    def stderr(self) -> bytes:
        return bytes(self._stderr)

    @property
    def exit_code(self) -> int | None:
        """The command's exit code once the status came (None before, or on a server failure)."""
        return exit_code_of(self.status) if self.status is not None else None

    async def receive(self, max_bytes: int) -> bytes:
        while not self._stdout:
            if self._ended:
                return b""
            if self._closed:
                raise anyio.ClosedResourceError
            await self._read_message()
            if self._closed:  # closed while this waited
                raise anyio.ClosedResourceError
        chunk = bytes(self._stdout[:max_bytes])
        del self._stdout[:max_bytes]
        return chunk

    async def _read_message(self) -> None:
        msg = await self._ws.receive()
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
            self._ended = True
            return
        if msg.type == aiohttp.WSMsgType.ERROR:
            self._ended = True
            raise ValueError(f"the exec stream failed: {msg.data}")
        if msg.type != aiohttp.WSMsgType.BINARY:
            self._ended = True
            raise ValueError(f"the exec stream sent a {msg.type.name} message; only binary channel messages are valid")
        data: bytes = msg.data
        if not data or len(data) == 1:
            return  # the first message after the upgrade is empty (the connection is up)
        channel, payload = data[0], data[1:]
        if channel == STDOUT:
            self._stdout += payload
        elif channel == STDERR:
            self._stderr = (self._stderr + payload)[-STDERR_KEPT:]
        elif channel == STATUS:
            self._ended = True
            try:
                parsed = json.loads(payload)
            except ValueError:
                parsed = None
            self.status = parsed if isinstance(parsed, dict) else {"status": "Failure", "message": "unreadable status"}
        elif channel == CLOSE and self.protocol == V5 and len(payload) == 1:
            if payload[0] in (STDOUT, STATUS):  # the server closed the stream we read
                self._ended = True
        else:
            self._ended = True
            raise ValueError(f"the exec stream used channel {channel}, which carries nothing here")

    async def send(self, data: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        async with self._send_lock:
            view = memoryview(data)
            while view:
                chunk, view = view[:SEND_CHUNK], view[SEND_CHUNK:]
                try:
                    await self._ws.send_bytes(bytes([STDIN]) + bytes(chunk))
                except (ConnectionResetError, aiohttp.ClientError) as exc:
                    raise anyio.BrokenResourceError from exc

    def send_nowait(self, data: bytes) -> int:
        return 0  # a websocket message is sent by awaiting it

    def ended(self) -> bool:
        return self._ended or self._ws.closed

    def close(self) -> None:
        """Close stdin (v5) and the socket; the agent sees its stdin end and exits."""
        if self._closed:
            return
        self._closed = True

        async def shut() -> None:
            try:
                with contextlib.suppress(Exception):
                    if self.protocol == V5 and not self._ws.closed:
                        await self._ws.send_bytes(bytes([CLOSE, STDIN]))
                    await self._ws.close()
            finally:  # cancelled half-way (a loop closing): the connection is still given back
                if not self._ws.closed:
                    self._ws._response.close()

        # close() is synchronous in the transport protocol; the socket's closing handshake runs
        # on the loop (aiohttp is asyncio's), and a reader waiting in receive() wakes with it
        with contextlib.suppress(RuntimeError):  # no loop running: the socket goes with the session
            task = asyncio.get_running_loop().create_task(shut())
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)

    async def close_stdin(self) -> bool:
        """v5 only: close the agent's stdin and keep reading its output. False on v4 (no CLOSE)."""
        if self.protocol != V5 or self._ws.closed:
            return False
        await self._ws.send_bytes(bytes([CLOSE, STDIN]))
        return True
