"""Ports carried by the resident agent (runtime/agent/ports.py, sandbox_agent.py PortRelay): the
real agent program as a child process over pipes, talking to real servers on this host's
loopback. What is tested is the relay's own logic: bytes both ways, whole and in order, the
window in both directions, refusals (nothing listens, another user's server, too many), and a
hostile agent's frames (data past the window, acknowledgements of bytes never sent) ending the
link. In a container, through the service, see test_preview_docker.py."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from sandbox.errors import PortUnreachable
from sandbox.runtime.agent.link import AgentLink, AgentUnavailable
from sandbox.runtime.agent.pipe import LocalAgents
from sandbox.runtime.agent.ports import PORT_WINDOW
from tests.test_agent_link_pipe import AGENT, LABELS, hostile

pytestmark = pytest.mark.anyio


@pytest.fixture
async def link() -> AsyncIterator[AgentLink]:
    starter = LocalAgents(LABELS)
    opened = await AgentLink.open(starter, "container-id", str(AGENT), None)
    yield opened
    opened.close()
    starter.reap()


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A loopback server that answers every connection with the sha256 of what it read (after
    the client's half-close is impossible over a tunnel, so: a 4-byte length, then the bytes),
    then sends back `n` bytes of a pattern the client asked for."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            head = b""
            while len(head) < 8:
                head += conn.recv(8 - len(head))
            size, back = int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")
            digest = hashlib.sha256()
            got = 0
            while got < size:
                chunk = conn.recv(min(65536, size - got))
                if not chunk:
                    return
                digest.update(chunk)
                got += len(chunk)
            conn.sendall(digest.digest())
            conn.sendall(pattern(back))

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


def pattern(n: int) -> bytes:
    return (b"0123456789abcdef" * (n // 16 + 1))[:n]


class Reader:
    """Exactly n bytes at a time from a tunnel (a read may end past them: the rest is kept)."""

    def __init__(self, stream: object) -> None:
        self.stream = stream
        self.kept = bytearray()

    async def exactly(self, n: int) -> bytes:
        while len(self.kept) < n:
            chunk = await self.stream.read()  # type: ignore[attr-defined]
            assert chunk, f"the stream ended after {len(self.kept)} of {n} bytes"
            self.kept += chunk
        out = bytes(self.kept[:n])
        del self.kept[:n]
        return out


async def read_exactly(stream: object, n: int) -> bytes:
    return await Reader(stream).exactly(n)


async def test_bytes_cross_both_ways_whole_and_in_order_past_the_window(link: AgentLink, echo_port: int) -> None:
    sent = os.urandom(3 * PORT_WINDOW + 12345)  # several windows each way
    back = 5 * PORT_WINDOW + 7
    async with await link.open_port(echo_port) as stream:
        await stream.write(len(sent).to_bytes(4, "big") + back.to_bytes(4, "big"))
        await stream.write(sent)
        reader = Reader(stream)
        assert await reader.exactly(32) == hashlib.sha256(sent).digest()
        assert await reader.exactly(back) == pattern(back)
        assert await stream.read() == b""  # the server closed its side
    assert link.dead is None and not link._ports


async def test_a_slow_reader_holds_at_most_one_window(link: AgentLink, echo_port: int) -> None:
    async with await link.open_port(echo_port) as stream:
        await stream.write((0).to_bytes(4, "big") + (20 * PORT_WINDOW).to_bytes(4, "big"))
        with anyio.fail_after(10):  # nobody reads: the link takes in one window (read as it pings)
            while len(stream._inbox) < PORT_WINDOW:
                await link.ping()
        for _ in range(3):
            await link.ping()  # and no more, however long it goes on reading
        assert len(stream._inbox) == PORT_WINDOW
        assert len(await read_exactly(stream, 32 + 20 * PORT_WINDOW)) == 32 + 20 * PORT_WINDOW
    assert link.dead is None


async def test_connections_are_independent_and_commands_still_run(link: AgentLink, echo_port: int) -> None:
    async def one(n: int) -> bytes:
        async with await link.open_port(echo_port) as stream:
            await stream.write((0).to_bytes(4, "big") + n.to_bytes(4, "big"))
            return await read_exactly(stream, 32 + n)

    results: dict[int, bytes] = {}

    async def keep(n: int) -> None:
        results[n] = await one(n)

    async with anyio.create_task_group() as tg:
        for n in (10, 70000, 400000):
            tg.start_soon(keep, n)
        tg.start_soon(link.run, ["true"])
    assert {n: r[32:] for n, r in results.items()} == {n: pattern(n) for n in (10, 70000, 400000)}


async def test_nothing_listening_is_a_refusal_and_the_link_lives_on(link: AgentLink) -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]  # bound, never listening
        with pytest.raises(PortUnreachable, match="nothing listens") as caught:
            await link.open_port(port)
    assert caught.value.why == "not_listening" and link.dead is None and not link._ports
    assert (await link.run(["true"])).exit_code == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a server of another user needs root to start")
async def test_a_server_of_another_user_is_refused(link: AgentLink, tmp_path: Path) -> None:
    # the agent runs as this test's user (root); the server as nobody, from its first syscall on
    # (a listener made by root and handed down would be root's until it accepts: the kernel names
    # an accepted connection's owner by who made the listener, then by who accepted it)
    code = (
        "import os, socket, sys, time\n"
        "os.setuid(65534)\n"
        "s = socket.create_server(('127.0.0.1', 0))\n"
        "print(s.getsockname()[1], flush=True)\n"
        "while True:\n    c, _ = s.accept(); time.sleep(5)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        with anyio.fail_after(10):
            line = await anyio.to_thread.run_sync(server.stdout.readline)
        port = int(line)
        with pytest.raises(PortUnreachable, match=r"does not run as this session's user") as caught:
            await link.open_port(port)
        assert caught.value.why == "not_owner" and link.dead is None
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


async def test_an_agent_too_old_to_carry_ports_says_so(tmp_path: Path) -> None:
    starter = LocalAgents(LABELS)
    script = hostile(tmp_path, "sys.stdin.buffer.read()\n")  # greets without `ports`
    link = await AgentLink.open(starter, "cid", script, None)
    try:
        with pytest.raises(PortUnreachable, match="images build") as caught:
            await link.open_port(80)
        assert caught.value.why == "no_relay"
    finally:
        link.close()
        starter.reap()


def port_agent(tmp_path: Path, frames: str) -> str:
    """A stand-in agent that greets with ports, waits for the first request, says `popened`
    for it (id 1), then sends `frames` (Python lines; w() writes, frame() builds)."""
    script = tmp_path / "port_agent.py"
    script.write_text(
        "import json, os, struct, sys, time\n"
        "def w(b): sys.stdout.buffer.write(b); sys.stdout.buffer.flush()\n"
        "def frame(h, p=b''): h = json.dumps(h).encode(); return struct.pack('>II', len(h), len(p)) + h + p\n"
        "w(frame({'t': 'hello', 'id': 0, 'protocol': 1, 'pid': os.getpid(), 'pidfd': False, 'ports': True}))\n"
        "sys.stdin.buffer.read(8)\n"
        "w(frame({'t': 'popened', 'id': 1}))\n" + frames + "sys.stdin.buffer.read()\n"
    )
    return str(script)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ("[w(frame({'t': 'pdata', 'id': 1}, b'x' * 65536)) for _ in range(5)]\n", "window"),
        ("w(frame({'t': 'pack', 'id': 1, 'n': 10}))\n", "acknowledged 10 bytes"),
        ("w(frame({'t': 'popened', 'id': 1}))\n", "twice"),
        ("w(frame({'t': 'pdata', 'id': 1}))\n", "empty"),
    ],
    ids=["past-the-window", "ack-never-sent", "opened-twice", "empty-data"],
)
async def test_a_hostile_agents_port_frames_end_the_link(tmp_path: Path, frames: str, reason: str) -> None:
    starter = LocalAgents(LABELS)
    link = await AgentLink.open(starter, "cid", port_agent(tmp_path, frames), None)
    try:
        with pytest.raises(AgentUnavailable), anyio.fail_after(10):
            await link.open_port(8000)  # nobody reads what arrives: the window is the agent's to keep
            while True:
                await link.wait_port(lambda: False)
        assert reason in (link.dead or "")
    finally:
        link.close()
        starter.reap()


async def test_a_stalled_preview_does_not_stall_the_link(link: AgentLink, echo_port: int, tmp_path: Path) -> None:
    """A tunnel nobody reads (a browser that paused a download) fills the agent's output; the
    agent then reads no request until someone takes it. A request written meanwhile (a file
    write of several frames, an upload) reads the stream as it writes, so it goes through."""
    stalled = [await link.open_port(echo_port) for _ in range(3)]
    for stream in stalled:  # each server sends 2 MiB that nobody reads
        await stream.write((0).to_bytes(4, "big") + (2 << 20).to_bytes(4, "big"))
    with anyio.fail_after(10):  # until each holds its window: the agent's output fills behind them
        while any(len(stream._inbox) < PORT_WINDOW for stream in stalled):
            await link.ping()
    header = {"t": "fwrite", "root": str(tmp_path), "parts": ["big.bin"], "mode": 0o600}
    with anyio.fail_after(20):
        wrote, _ = await link.file_request(header, [os.urandom(64 << 10) for _ in range(8)])
    assert wrote.t == "file" and (tmp_path / "big.bin").stat().st_size == 8 * (64 << 10)
    assert link.dead is None and (await link.run(["true"])).exit_code == 0
    for stream in stalled:
        assert len(stream._inbox) <= PORT_WINDOW  # each held at most its window meanwhile
        await stream.aclose()


@pytest.mark.slow
async def test_a_server_that_does_not_accept_is_refused_without_stalling_the_agent(link: AgentLink) -> None:
    """A server whose backlog is full: each open is refused after the agent's connect bound,
    all at once rather than one after another, and the agent runs commands meanwhile."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)  # and never accepts
    port = server.getsockname()[1]
    filler = [socket.create_connection(("127.0.0.1", port), timeout=2)]  # the one place the backlog has
    whys: list[str] = []

    async def one() -> None:
        try:
            async with await link.open_port(port):
                whys.append("opened")
        except PortUnreachable as exc:
            whys.append(exc.why)

    try:
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one)
            await anyio.sleep(0.5)
            assert (await link.run(["true"])).exit_code == 0  # the agent is not stuck in a connect
        assert whys == ["not_accepting"] * 6, whys
        assert time.monotonic() - started < 9  # together, not 6 x 5 s
        assert link.dead is None
    finally:
        for s in filler:
            s.close()
        server.close()
