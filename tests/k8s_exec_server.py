"""A stand-in for the API server's `pods/exec` websocket, bridged to a real local process.

It speaks what the API server speaks (apimachinery wsstream, apiserver's stream translator):
the subprotocols it is told to accept (v5 and v4 by default; v4 only plays a kubelet behind an
old API server), one channel byte per message, an empty first message on channel 1, `[255, 0]`
closing stdin in v5 (ignored in v4), one `Status` on channel 3 when the command ends (exit code
as the `ExitCode` cause), and 403 with a `Status` body for a token that may not exec. The
command runs here as a child process (`/usr/bin/python3` is this interpreter), so the real
agent program answers over it. Faults on request: cut the stream after N bytes of output (mid
frame), cut it when idle, send garbage on an unknown channel, announce a 1 GiB message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import WSMsgType, web

V5, V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"


@dataclass
class Faults:
    """What the server does wrong on purpose (all off by default)."""

    cut_after_bytes: int | None = None  # close the TCP connection after this much stdout, mid-message
    idle_cut_s: float | None = None  # close the websocket after this long without traffic either way
    garbage: bool = False  # send a message on channel 7 after the first output
    huge: bool = False  # announce a 1 GiB binary message, then send nothing


@dataclass
class ExecServer:
    """`async with ExecServer() as server: server.url`; `server.execs` records each request."""

    protocols: tuple[str, ...] = (V5, V4)
    token: str = "good-token"  # any other token may not `create` on pods/exec: 403
    faults: Faults = field(default_factory=Faults)
    execs: list[dict[str, Any]] = field(default_factory=list)
    # (pod, argv) -> what runs on this host: argv itself by default; a fake cluster runs it in
    # the Pod's container (tests/k8s_fake_cluster.py)
    command_for: Callable[[str, list[str]], list[str]] | None = None
    url: str = ""
    _runner: web.AppRunner | None = None
    _procs: list[asyncio.subprocess.Process] = field(default_factory=list)

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/exec", self._exec)
        self.add_routes(app)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for proc in self._procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert self._runner is not None
        await self._runner.cleanup()

    def add_routes(self, app: web.Application) -> None:
        """More routes on the same server (a fake cluster's objects)."""

    def alive(self) -> list[asyncio.subprocess.Process]:
        """Commands still running (a closed stream must leave none)."""
        return [p for p in self._procs if p.returncode is None]

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        record: dict[str, Any] = {"pod": request.match_info["pod"], "query": list(request.query.items()), "auth": auth}
        self.execs.append(record)
        token = auth.removeprefix("Bearer ")
        if token != self.token:
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f'pods "{record["pod"]}" is forbidden: cannot create resource "pods/exec"',
                "reason": "Forbidden",
                "code": 403,
            }
            return web.json_response(status, status=403)
        ws = web.WebSocketResponse(protocols=self.protocols, autoping=True, max_msg_size=16 * 1024 * 1024)
        await ws.prepare(request)
        record["negotiated"] = ws.ws_protocol
        if ws.ws_protocol not in self.protocols:
            await ws.close()
            return ws
        argv = request.query.getall("command")
        if self.command_for is not None:
            argv = self.command_for(record["pod"], argv)
        elif argv and argv[0] == "/usr/bin/python3":
            argv = [sys.executable, *argv[1:]]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        self._procs.append(proc)
        await ws.send_bytes(b"\x01")  # the connection is up
        if self.faults.huge:
            # a binary frame header announcing 2**30 bytes, written raw, then silence
            transport = request.transport
            assert transport is not None
            transport.write(b"\x82\x7f" + struct.pack(">Q", 1 << 30))
        activity = asyncio.Event()
        tasks = [
            asyncio.create_task(self._pump(proc.stdout, ws, 1, request, activity)),
            asyncio.create_task(self._pump(proc.stderr, ws, 2, request, activity)),
            asyncio.create_task(self._stdin(ws, proc, activity)),
        ]
        if self.faults.idle_cut_s is not None:
            tasks.append(asyncio.create_task(self._idle_cut(ws, activity, self.faults.idle_cut_s)))
        await asyncio.wait(tasks[:2], return_when=asyncio.ALL_COMPLETED)
        code = await proc.wait()
        if not ws.closed:
            await ws.send_bytes(b"\x03" + json.dumps(_status(code)).encode())
            await ws.close()
        for task in tasks:
            task.cancel()
        return ws

    async def _pump(
        self,
        stream: asyncio.StreamReader | None,
        ws: web.WebSocketResponse,
        channel: int,
        request: web.Request,
        activity: asyncio.Event,
    ) -> None:
        assert stream is not None
        sent = 0
        while chunk := await stream.read(65536):
            activity.set()
            if ws.closed:
                return
            cut = self.faults.cut_after_bytes
            if channel == 1 and cut is not None and sent + len(chunk) > cut:
                # what fits, then the connection dies under the message (no close frame)
                await ws.send_bytes(bytes([channel]) + chunk[: max(cut - sent, 1)])
                transport = request.transport
                if transport is not None:
                    transport.abort()
                return
            await ws.send_bytes(bytes([channel]) + chunk)
            sent += len(chunk)
            if channel == 1 and self.faults.garbage:
                await ws.send_bytes(b"\x07not a channel")

    async def _stdin(
        self, ws: web.WebSocketResponse, proc: asyncio.subprocess.Process, activity: asyncio.Event
    ) -> None:
        assert proc.stdin is not None
        async for msg in ws:
            activity.set()
            if msg.type != WSMsgType.BINARY or not msg.data:
                continue
            channel, payload = msg.data[0], msg.data[1:]
            if channel == 0:
                with contextlib.suppress(ConnectionError):
                    proc.stdin.write(payload)
                    await proc.stdin.drain()
            elif channel == 255 and ws.ws_protocol == V5:
                if len(payload) != 1:
                    break  # a malformed close signal ends the connection, as wsstream does
                if payload[0] == 0:
                    proc.stdin.close()
            # v4: [255, 0] is a frame on an unknown channel, ignored (stdin stays open)
        # the client went away: the command's stdin ends (the kubelet closes it), as on a cluster
        with contextlib.suppress(ConnectionError):
            proc.stdin.close()

    async def _idle_cut(self, ws: web.WebSocketResponse, activity: asyncio.Event, idle_s: float) -> None:
        while not ws.closed:
            activity.clear()
            try:
                await asyncio.wait_for(activity.wait(), idle_s)
            except TimeoutError:
                await ws.close()
                return


def _status(code: int) -> dict[str, Any]:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: exit status {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }
