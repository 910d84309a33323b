"""Run the HTTP service for real on a loopback port in a thread; tests talk to it with httpx."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

TOKEN_A = "sbx_test-token-of-tenant-a"
TOKEN_B = "sbx_test-token-of-tenant-b"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@contextmanager
def serve(config: Any) -> Iterator[str]:
    """The service over `config` on 127.0.0.1 (an ephemeral port); yields its base URL."""
    import uvicorn  # imported when a test serves, not when the quick tier is collected

    from sandbox.api.app import create_app
    from sandbox.api.serving import uvicorn_config

    server = uvicorn.Server(uvicorn_config(create_app(config), host="127.0.0.1", port=0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the service did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def free_port() -> int:
    """A loopback port nobody listens on now (for a server in another process or container)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_healthy(url: str, *, seconds: float = 90, gone: Any = None) -> None:
    """Wait until `url`/healthz answers 200. `gone()` (optional) returns a text when the server
    died meanwhile; it is raised at once. Raises AssertionError after `seconds`."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if gone is not None and (why := gone()) is not None:
            raise AssertionError(f"the service exited: {why}")
        time.sleep(0.2)
    raise AssertionError(f"the service never answered at {url}")


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """`app` served by uvicorn (the service's own settings) inside the current event loop, on an
    ephemeral loopback port; yields its base URL. For apps over an orchestrator the test holds
    (a fake backend), which must live in the same loop."""
    import anyio
    import uvicorn

    from sandbox.api.serving import uvicorn_config

    server = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(30):
            while not server.started:
                await anyio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True


@contextmanager
def serve_process(config_path: Path, *, nofile: int | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`sandbox serve` in its own process (optionally with RLIMIT_NOFILE lowered to `nofile`),
    on a free loopback port; yields its base URL and the process. Stopped with SIGTERM."""
    import resource

    port = free_port()

    def limit() -> None:  # pragma: no cover - runs in the child
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    log = (config_path.parent / "serve.log").open("wb")  # its log, for a failing test to show
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox", "--config", str(config_path), "serve", "--port", str(port), "--grace", "1"],
        stdout=log,
        stderr=log,
        preexec_fn=limit,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, gone=lambda: None if proc.poll() is None else f"exit {proc.returncode}")
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB: what it holds now, and the most it ever held."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def remove_instance(instance: str) -> None:
    """Remove the containers a `sandbox serve` of the test made for `instance` (its session
    sandboxes outlive a service that is killed or stopped: the test made them, the test removes them)."""
    import docker

    from sandbox.runtime.naming import Labels

    client = docker.from_env()
    try:
        for box in client.containers.list(all=True, filters={"label": f"{Labels.INSTANCE}={instance}"}):
            box.remove(force=True)
    finally:
        client.close()
