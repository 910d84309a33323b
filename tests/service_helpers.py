"""Run the HTTP service for real on a loopback port in a thread; tests talk to it with httpx."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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

    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=0, log_level="warning"))
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
