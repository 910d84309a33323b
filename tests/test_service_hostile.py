"""The service under hostile clients, against a real `sandbox serve` process: bodies sent without
a token or past the limit (chunked, no declared size), and connections held open without a
request head. The server's memory is read from /proc/<pid>/status (VmRSS, VmHWM)."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import __version__
from sandbox.api.connections import limits_of
from sandbox.config.models import ServiceSection
from tests.service_helpers import TOKEN_A, TOKEN_B, rss_kib, serve_process, sha

A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}
MIB = 1024 * 1024


def write_config(tmp: Path, extra: str = "") -> Path:
    (tmp / "wa").mkdir(exist_ok=True)
    (tmp / "wb").mkdir(exist_ok=True)
    path = tmp / "service.yaml"
    path.write_text(f"""
state_dir: {tmp / "state"}
{extra}
tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: alpha, tenant: acme, workspace: "{tmp / "wa"}"}}
    - {{id: beta, tenant: globex, workspace: "{tmp / "wb"}"}}
""")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    tmp = tmp_path_factory.mktemp("hostile")
    with serve_process(write_config(tmp, "service: {head_timeout_s: 2}")) as running:
        yield running


def send_chunked(url: str, path: str, headers: dict[str, str], chunks: Iterator[bytes]) -> str:
    """POST a chunked body (no Content-Length) over a raw socket; returns what the server
    answered (read concurrently: a server that answers early may close before the body ends)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    answer = bytearray()

    def read() -> None:
        try:
            while data := sock.recv(65536):
                answer.extend(data)
        except OSError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    try:
        sock.sendall(head.encode())
        for chunk in chunks:
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            if answer:  # answered: a polite client stops sending
                break
        else:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server closed its side: the answer was read meanwhile
    reader.join(timeout=30)
    sock.close()
    return answer.decode(errors="replace")


def padded_batch(total: int) -> Iterator[bytes]:
    """A valid batch JSON of about `total` bytes, in 1 MiB chunks."""
    yield b'{"calls": [{"tool": "read", "args": {"path": "x.txt", "pad": "'
    left = total
    while left > 0:
        yield b"x" * min(MIB, left)
        left -= MIB
    yield b'"}}]}'


@pytest.mark.slow
def test_a_chunked_body_without_a_token_is_refused_before_it_is_read(server: tuple[str, Any]) -> None:
    """100 MiB chunked, no token, to the batches route (FastAPI read such a body whole before the
    token check: +290 MB of RSS), to the call route and to /mcp: each is 401 at once, and the
    server's peak memory does not grow with the bodies."""
    url, proc = server
    rss_before, hwm_before = rss_kib(proc.pid)
    for path in ("/v1/sessions/agent:alpha:s/batches", "/v1/sessions/agent:alpha:s/calls", "/mcp/"):
        answer = send_chunked(url, path, {}, padded_batch(100 * MIB))
        assert answer.startswith("HTTP/1.1 401"), (path, answer[:300])
    rss_after, hwm_after = rss_kib(proc.pid)
    grown = hwm_after - max(rss_before, 0)
    print(
        f"no token, 3 x 100 MiB chunked: VmRSS {rss_before} -> {rss_after} KiB, "
        f"VmHWM {hwm_before} -> {hwm_after} KiB (peak above the start: {grown / 1024:.1f} MiB)"
    )
    assert hwm_after - hwm_before < 16 * 1024 and rss_after - rss_before < 16 * 1024


@pytest.mark.slow
def test_a_chunked_body_past_the_limit_is_413(server: tuple[str, Any]) -> None:
    """48 MiB chunked with a valid token (the old limit looked only at Content-Length: 200) is 413
    on the call and batches routes; the server's memory stays bounded by the 40 MiB limit."""
    url, proc = server
    rss_before, _ = rss_kib(proc.pid)
    for path in ("/v1/sessions/agent:alpha:s/batches", "/v1/sessions/agent:alpha:s/calls"):
        answer = send_chunked(url, path, A, padded_batch(48 * MIB))
        assert answer.startswith("HTTP/1.1 413"), (path, answer[:300])
        assert "larger than" in answer
    rss_after, hwm_after = rss_kib(proc.pid)
    print(f"token, 2 x 48 MiB chunked: VmRSS {rss_before} -> {rss_after} KiB, VmHWM {hwm_after} KiB")
    # a body under the limit is still served, on a new connection
    ok = httpx.post(
        f"{url}/v1/sessions/agent:alpha:s/batches", headers=A, json={"calls": [{"tool": "read", "args": {"path": "n"}}]}
    )
    assert ok.status_code == 200, ok.text


def closed(sock: socket.socket) -> bool:
    """Whether the server closed this connection (EOF or reset), without waiting; what it sent
    before closing (an error answer) is read and dropped."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if sock.recv(65536) == b"":
                return True
        except OSError:
            return True
    return False


@pytest.mark.slow
def test_idle_connections_without_a_token_do_not_lock_tenants_out(tmp_path: Path) -> None:
    """300 connections from one address that send no request head (half send part of one), against
    a server whose file-descriptor limit is 256 (the old server stopped accepting at its limit:
    every tenant locked out): another tenant is served meanwhile, and every idle connection is
    closed once the head timeout passes, a slow one dribbling its head included."""
    cfg = write_config(tmp_path, "service: {head_timeout_s: 2}")
    with serve_process(cfg, nofile=256) as (url, _proc):
        host, port = url.removeprefix("http://").split(":")
        held: list[socket.socket] = []
        try:
            for i in range(300):
                s = socket.create_connection((host, int(port)), timeout=10)
                if i % 2:
                    s.sendall(b"POST /v1/sessions/agent:alpha:x/calls HTTP/1.1\r\nHost: x\r\n")
                held.append(s)
            dribbler = socket.create_connection((host, int(port)), timeout=10)
            held.append(dribbler)
            r = httpx.post(
                f"{url}/v1/sessions/agent:beta:s/calls",
                headers=B,
                json={"tool": "read", "args": {"path": "none.txt"}},
                timeout=10,
            )
            assert r.status_code == 200 and r.json()["error"]["code"] == "FILE_NOT_FOUND", r.text
            # accepted in order: every one of them was seen before the tenant's connection
            open_then = sum(not closed(s) for s in held)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(closed(s) for s in held):
                with contextlib.suppress(OSError):  # a head that never completes: still closed at the timeout
                    dribbler.sendall(b"X")
                time.sleep(0.25)
            still_open = sum(not closed(s) for s in held)
            print(f"301 idle connections: {open_then} held open at once, {still_open} open after the head timeout")
            assert still_open == 0
            # held below the file-descriptor limit: at most the bound the server derived from it
            assert open_then <= limits_of(ServiceSection(head_timeout_s=2), nofile=256).max_connections < 256
            # the tenant is still served after the storm
            again = httpx.get(f"{url}/v1/agents", headers=B, timeout=10)
            assert again.status_code == 200
        finally:
            for s in held:
                s.close()


@pytest.mark.slow
def test_a_head_larger_than_the_bound_is_refused(server: tuple[str, Any]) -> None:
    """A request head that grows without end (one endless header) is cut at 64 KiB, not buffered."""
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: ")
        sent = 0
        with pytest.raises(OSError):
            while sent < 8 * MIB:
                s.sendall(b"a" * 65536)
                sent += 65536
                time.sleep(0.001)
            raise AssertionError(f"the server took {sent} bytes of one header")
    finally:
        s.close()
    assert httpx.get(f"{url}/healthz").json() == {"ok": True, "version": __version__}
