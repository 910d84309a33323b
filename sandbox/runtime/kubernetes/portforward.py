"""A Pod's port on this host's loopback, through the API server's `pods/portforward` websocket.

How the orchestrator reaches a browser Pod's DevTools port on a cluster without opening the
Pod's network: the deny-all NetworkPolicy stays whole, and the stream goes API server ->
kubelet -> the Pod's network namespace, as `kubectl port-forward` does.

The websocket protocol (`v4.channel.k8s.io`, the kubelet's websocket port forwarding): one
forwarded port per websocket, on two channels, data (0) and error (1). Each message is a channel
byte and its payload. The server's first message on each channel is the port number (two bytes,
little-endian); data follows on channel 0, and a message on channel 1 is an error that ends the
stream. One websocket carries one TCP connection, so each connection accepted on the local
listener opens one websocket. The server's messages are hostile input: a message is bounded,
an unknown channel or a wrong port number ends the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import aiohttp
import anyio
import anyio.abc

from sandbox._log import logger
from sandbox.runtime.kubernetes.exec_ws import V4, ExecRefused, upgrade

DATA, ERROR = 0, 1
MAX_MESSAGE_BYTES = 1024 * 1024
HANDSHAKE_S = 15.0
READ_CHUNK = 64 * 1024


def portforward_url(base: str, namespace: str, pod: str, port: int) -> str:
    """The websocket URL forwarding `port` of `pod`."""
    root = base.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return f"{root}/api/v1/namespaces/{namespace}/pods/{pod}/portforward?{urlencode({'ports': port})}"


async def open_forward(
    session: aiohttp.ClientSession, url: str, port: int, *, headers: Mapping[str, str] | None = None, ssl: Any = None
) -> aiohttp.ClientWebSocketResponse:
    """Open one forwarding websocket and read the server's two port frames.

    Raises:
        ExecRefused: the upgrade was refused (403: the orchestrator may not `create` on
            `pods/portforward`; 404: no such Pod), or the server's first frames were not this port's.
    """
    ws = await upgrade(
        session,
        url,
        "port forward",
        "pods/portforward",
        protocols=(V4,),
        headers=headers,
        ssl=ssl,
        heartbeat_s=None,
        max_message_bytes=MAX_MESSAGE_BYTES,
    )
    try:
        if ws.protocol != V4:
            raise ExecRefused(0, f"the port forward agreed to {ws.protocol or 'no subprotocol'}, not {V4}")
        seen: set[int] = set()
        expected = bytes([port & 0xFF, port >> 8])
        with anyio.fail_after(HANDSHAKE_S):  # a server that never sends them holds nothing for long
            while seen != {DATA, ERROR}:
                first = await ws.receive()
                if first.type != aiohttp.WSMsgType.BINARY:
                    raise ExecRefused(0, f"the port forward ended before it started ({first.type.name})")
                data = bytes(first.data)
                if len(data) != 3 or data[0] not in (DATA, ERROR) or data[1:] != expected:
                    raise ExecRefused(0, "the port forward's first frames did not name the port asked for")
                seen.add(data[0])
    except TimeoutError as exc:
        await ws.close()
        raise ExecRefused(0, f"the port forward sent no port frames within {HANDSHAKE_S:g}s") from exc
    except BaseException:
        await ws.close()
        raise
    return ws


class LocalForward:
    """A listener on 127.0.0.1 whose every connection is carried to one Pod's port.

    Args:
        connect: opens one forwarding websocket (:func:`open_forward` with its URL and credentials).
        name: what the log lines name (the Pod).
    """

    def __init__(self, connect: Callable[[], Awaitable[aiohttp.ClientWebSocketResponse]], name: str) -> None:
        self._connect = connect
        self._name = name
        self._task: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> int:
        """Listen (on a free loopback port) and serve in a task of its own; the port."""
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = int(listener.extra(anyio.abc.SocketAttribute.local_port))  # noqa: S610 - anyio, not Django

        async def serve() -> None:
            async with listener:
                await listener.serve(self._carry)

        # a task of its own: the forward outlives the call that opened it (the browser stays)
        self._task = asyncio.create_task(serve())
        return self.port

    async def aclose(self) -> None:
        """Stop listening and cut every connection carried."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=5)

    @property
    def serving(self) -> bool:
        """Whether it still listens."""
        return self._task is not None and not self._task.done()

    async def _carry(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            try:
                ws = await self._connect()
            except Exception as exc:
                logger.bind(pod=self._name, error=str(exc)).warning("k8s_portforward_refused")
                return
            try:
                async with anyio.create_task_group() as group:
                    group.start_soon(_upstream, client, ws, group.cancel_scope)
                    await _downstream(ws, client, self._name)
                    group.cancel_scope.cancel()
            finally:
                await ws.close()


async def _upstream(
    client: anyio.abc.SocketStream, ws: aiohttp.ClientWebSocketResponse, scope: anyio.CancelScope
) -> None:
    """What the local client sends, onto the data channel; its end ends the stream."""
    try:
        while True:
            chunk = await client.receive(READ_CHUNK)
            await ws.send_bytes(bytes([DATA]) + chunk)
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
        pass
    scope.cancel()


async def _downstream(ws: aiohttp.ClientWebSocketResponse, client: anyio.abc.SocketStream, name: str) -> None:
    """The data channel, to the local client, until the stream ends or errs."""
    while True:
        message = await ws.receive()
        if message.type != aiohttp.WSMsgType.BINARY:
            return
        data = bytes(message.data)
        if not data:
            return
        if data[0] == ERROR:
            logger.bind(pod=name, error=data[1:200].decode(errors="replace")).info("k8s_portforward_error")
            return
        if data[0] != DATA:  # a channel this stream does not have: its framing is unknown
            logger.bind(pod=name, channel=data[0]).warning("k8s_portforward_unknown_channel")
            return
        try:
            await client.send(data[1:])
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            return
