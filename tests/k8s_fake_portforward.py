"""The fake cluster's `pods/portforward` (tests/k8s_fake_cluster.py): the kubelet's websocket
port forwarding (`v4.channel.k8s.io`), one port per websocket, its two channels opened with the
port number, the data relayed to that port inside the Pod by `socat` run in its container (as
the kubelet relays in the Pod's network namespace). Faults on demand: a wrong port in the first
frames, an error on the error channel, a message on a channel that does not exist."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import WSMsgType, web

V4 = "v4.channel.k8s.io"


async def portforward(cluster: Any, request: web.Request) -> web.StreamResponse:
    """Serve one forwarding websocket for the cluster's Pod (403 without the token, 404 without the Pod)."""
    cluster.requests.append((request.method, request.path))
    if request.headers.get("Authorization") != f"Bearer {cluster.token}":
        return web.json_response({"kind": "Status", "code": 403, "message": "forbidden"}, status=403)
    namespace, name = request.match_info["ns"], request.match_info["name"]
    if ("pods", namespace, name) not in cluster.objects:
        return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
    port = int(request.query.get("ports", "0"))
    ws = web.WebSocketResponse(protocols=(V4,))
    await ws.prepare(request)
    fault = cluster.portforward_fault
    announced = port + 1 if fault == "wrong-port" else port
    for channel in (0, 1):
        await ws.send_bytes(bytes([channel, announced & 0xFF, announced >> 8]))
    if fault == "error":
        await ws.send_bytes(b"\x01" + f"error forwarding port {port}: connection refused".encode())
        await ws.close()
        return ws
    if fault == "unknown-channel":
        await ws.send_bytes(b"\x07garbage")
        await ws.close()
        return ws
    argv = cluster.forward_command(namespace, name, port)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdout = proc.stdout

    async def down() -> None:
        while chunk := await stdout.read(65536):
            await ws.send_bytes(b"\x00" + chunk)
        await ws.close()

    relay = asyncio.create_task(down())
    try:
        async for message in ws:
            if message.type != WSMsgType.BINARY or not message.data or message.data[0] != 0:
                break
            proc.stdin.write(message.data[1:])
            await proc.stdin.drain()
    finally:
        with contextlib.suppress(Exception):
            proc.stdin.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(relay, 5)
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    return ws
