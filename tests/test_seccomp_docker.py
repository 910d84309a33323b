"""The strict seccomp profile, as attacks against the real engine: a Unix socket planted below the
workspace after the sandbox started is unreachable, and a canary server listening on it sees no
connection. The same attack with the engine's default profile reaches the canary, which shows the
canary would have told."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

CONNECT = (
    'python3 -c "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); '
    "s.sendall(b'hello from the sandbox'); print('CONNECTED')\" {path} 2>&1 | tail -1"
)


@contextmanager
def canary(path: Path) -> Iterator[list[bytes]]:
    """A Unix socket server at `path` that records what every connection sends."""
    received: list[bytes] = []
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    os.chmod(path, 0o777)  # only seccomp stands between the sandbox user and this socket
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                received.append(conn.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        stop.set()
        thread.join()
        server.close()


def config(make_config: Any, ws: Path, access: str, profile: str | None = None) -> Any:
    ws.mkdir(exist_ok=True)
    os.chown(ws, 1000, 1000)
    docker = f"docker: {{seccomp_profile: {profile}}}" if profile else ""
    return make_config(f"""
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: {access}, {docker}}}}}
  list: [{{id: a, workspace: "{ws}"}}]
""")


async def planted_socket_attack(
    make_config: Any, tmp_path: Path, access: str, profile: str | None
) -> tuple[str, list[bytes]]:
    """Start a sandbox, then plant a listening socket in its workspace and connect from inside."""
    ws = tmp_path / "ws"
    async with Orchestrator(config(make_config, ws, access, profile)) as orch:
        sess = orch.session("agent:a:s1")
        try:
            started = await sess.call("exec", {"command": "true"})
            assert started.ok and started.output["exit_code"] == 0, started
            with canary(ws / "db.sock") as received:  # planted after the sandbox started
                r = await sess.call("exec", {"command": CONNECT.format(path="/workspace/db.sock")})
                assert r.ok, r
                return str(r.output["output"]), received
        finally:
            await sess.close()


@pytest.mark.parametrize("access", ["rw", "ro"])
async def test_socket_planted_after_start_is_unreachable(make_config: Any, tmp_path: Path, access: str) -> None:
    """Default (strict) profile: connecting to a socket planted below the workspace fails; the canary gets nothing."""
    output, received = await planted_socket_attack(make_config, tmp_path, access, None)
    assert "PermissionError" in output and "Operation not permitted" in output, output
    assert "CONNECTED" not in output
    assert received == []


async def test_engine_default_profile_lets_the_attack_through(make_config: Any, tmp_path: Path) -> None:
    """The control: with the engine's default profile the same connect reaches the canary."""
    output, received = await planted_socket_attack(make_config, tmp_path, "rw", "default")
    assert "CONNECTED" in output, output
    assert received == [b"hello from the sandbox"]


async def test_strict_profile_keeps_an_ordinary_userland_working(make_config: Any, tmp_path: Path) -> None:
    """Pairs, IP sockets, fifos, threads, subprocesses and git work; namespaces and AF_UNIX do not."""
    ws = tmp_path / "ws"
    script = "; ".join(
        [
            "python3 -c \"import socket; a, b = socket.socketpair(); a.send(b'x'); print('pair', b.recv(1))\"",
            "python3 -c \"import socket; socket.socket(socket.AF_INET6); socket.socket(socket.AF_INET); print('inet ok')\"",
            "python3 -c \"import concurrent.futures as f; print('threads', sum(f.ThreadPoolExecutor(4).map(abs, [1, 2])))\"",
            "python3 -c \"import subprocess; print('sub', subprocess.run(['true']).returncode)\"",
            "mkfifo /tmp/f && echo fifo ok",
            "git init -q /tmp/r && echo git ok",
            "unshare -U true 2>/dev/null || echo no userns",
            'python3 -c "import socket; socket.socket(socket.AF_UNIX)" 2>/dev/null || echo no unix',
        ]
    )
    async with Orchestrator(config(make_config, ws, "rw")) as orch:
        sess = orch.session("agent:a:s2")
        try:
            r = await sess.call("exec", {"command": script})
        finally:
            await sess.close()
    out = str(r.output["output"])
    for expected in ("pair b'x'", "inet ok", "threads 3", "sub 0", "fifo ok", "git ok", "no userns", "no unix"):
        assert expected in out, out


# AF_UNIX with a high bit set (the kernel reads the low 32 bits), then connect to the canary
HIGH_BITS = (
    'python3 -c "import ctypes, socket, sys; libc = ctypes.CDLL(None, use_errno=True); '
    "fd = libc.syscall(41, ctypes.c_long(0x100000001), 1, 0); "
    "print('FD', fd, ctypes.get_errno()); s = socket.socket(fileno=fd) if fd >= 0 else None; "
    "s and s.connect(sys.argv[1]); s and s.sendall(b'high bits'); print('CONNECTED' if s else 'REFUSED')\" "
    "{path} 2>&1 | tail -2"
)
# a datagram pair may sendto() any datagram socket by path
DGRAM_PAIR = (
    'python3 -c "import socket, sys; a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); '
    "a.sendto(b'dgram', sys.argv[1]); print('SENT')\" {path} 2>&1 | tail -1"
)


async def test_af_unix_with_high_bits_and_datagram_pairs_are_refused(make_config: Any, tmp_path: Path) -> None:
    """The two ways round a "not AF_UNIX" rule: a 64-bit family value and a datagram pair's sendto."""
    ws = tmp_path / "ws"
    async with Orchestrator(config(make_config, ws, "rw")) as orch:
        sess = orch.session("agent:a:s3")
        try:
            await sess.call("exec", {"command": "true"})
            with canary(ws / "db.sock") as received:
                high = await sess.call("exec", {"command": HIGH_BITS.format(path="/workspace/db.sock")})
            dgram_path = ws / "log.sock"
            server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            server.bind(str(dgram_path))
            os.chmod(dgram_path, 0o777)
            server.settimeout(1)
            try:
                sent = await sess.call("exec", {"command": DGRAM_PAIR.format(path="/workspace/log.sock")})
                try:
                    got: bytes | None = server.recv(100)
                except TimeoutError:
                    got = None
            finally:
                server.close()
        finally:
            await sess.close()
    assert "REFUSED" in high.output["output"] and "FD -1 1" in high.output["output"], high.output
    assert received == []
    assert "SENT" not in sent.output["output"] and "Operation not permitted" in sent.output["output"], sent.output
    assert got is None
