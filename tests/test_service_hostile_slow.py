"""A tenant that is slow on purpose: a flood of log pages that take long to read (the journal
read is held, as a journal under load would hold it), and request bodies trickled a byte at a
time. The service runs for real (uvicorn and the guarded protocol on loopback; the trickle
against a `sandbox serve` process); other tenants and the probes must still be answered."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service_helpers import TOKEN_A, TOKEN_B, serve, serve_process
from tests.test_service_hostile import closed, write_config
from tests.test_service_hostile_reads import config

A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}
FLOOD = 48  # more than anyio's default pool of 40 threads


@pytest.fixture
def held_pages(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """acme's journal pages wait (in their worker thread) until `release` is set; `entered`
    counts those waiting. The fault only: the page read itself is the journal's own."""
    from sandbox.journal.store import Journal

    state: dict[str, Any] = {"entered": 0, "release": threading.Event(), "lock": threading.Lock()}
    original = Journal.page

    def page(self: Journal, **kwargs: Any) -> Any:
        if kwargs.get("tenant") == "acme":
            with state["lock"]:
                state["entered"] += 1
            state["release"].wait(60)
        return original(self, **kwargs)

    monkeypatch.setattr(Journal, "page", page)
    try:
        yield state
    finally:
        state["release"].set()


@pytest.mark.slow
def test_a_tenants_slow_log_pages_do_not_starve_the_probe_or_other_tenants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_pages: dict[str, Any]
) -> None:
    """48 of acme's log pages at once, each held in its journal read: they took every thread of
    anyio's shared pool (40), and /readyz's journal check and globex's logs waited behind them
    (readyz 503 "no answer", globex's read never answered). Now acme's reads hold at most its
    own 2 threads and queue behind them; globex and the probe are answered; acme's are answered
    once its reads go on."""
    from sandbox.api.read_pool import PER_TENANT

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")  # the engine check fails at once
    answers: list[int] = []
    with serve(config(tmp_path, "{}")) as url:

        def one() -> None:
            with contextlib.suppress(httpx.HTTPError):
                answers.append(httpx.get(f"{url}/v1/logs", headers=A, params={"limit": 5}, timeout=60).status_code)

        flood = [threading.Thread(target=one, daemon=True) for _ in range(FLOOD)]
        for t in flood:
            t.start()
        deadline = time.monotonic() + 5  # long enough for the flood to take every thread it can
        while time.monotonic() < deadline and held_pages["entered"] < 40:
            time.sleep(0.05)
        entered = held_pages["entered"]
        try:
            theirs = httpx.get(f"{url}/v1/logs", headers=B, params={"limit": 5}, timeout=10)
            ready = httpx.get(f"{url}/readyz", timeout=10)
        finally:
            held_pages["release"].set()
        for t in flood:
            t.join(60)
    print(
        f"{FLOOD} held log pages of acme: {entered} in threads at once; globex's logs {theirs.status_code}, "
        f"/readyz journal check {ready.json()['checks']['journal']!r}; acme's answers {sorted(set(answers))} x{len(answers)}"
    )
    assert entered <= PER_TENANT
    assert theirs.status_code == 200
    assert ready.json()["checks"]["journal"] == "ok"
    assert answers == [200] * FLOOD


def trickle(url: str, headers: dict[str, str], stop: threading.Event) -> socket.socket:
    """A call whose head is complete (Content-Length: 1000) and whose body then comes a byte at
    a time; the bytes go on (in a thread) until `stop` or until the server closes."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    head = "POST /v1/sessions/agent:alpha:slow/calls HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "Content-Length: 1000\r\n\r\n"
    s.sendall(head.encode())

    def dribble() -> None:
        while not stop.is_set():
            try:
                s.sendall(b" ")
            except OSError:
                return
            stop.wait(0.5)

    threading.Thread(target=dribble, daemon=True).start()
    return s


@pytest.mark.slow
def test_trickled_bodies_are_cut_at_the_body_timeout_and_another_tenant_is_served(tmp_path: Path) -> None:
    """acme sends 20 calls whose bodies trickle in a byte at a time, from one address whose bound
    is 20 connections: they were held open forever (the head timer stops at the head's end and
    nothing bounded the body), and globex at the same address was refused. Now each is closed
    body_timeout_s (2 s here) after its head, and globex is served."""
    cfg = write_config(tmp_path, "service: {head_timeout_s: 2, body_timeout_s: 2, max_connections_per_address: 20}")
    with serve_process(cfg) as (url, _proc):
        stop = threading.Event()
        held = [trickle(url, A, stop) for _ in range(20)]
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not all(closed(s) for s in held):
                time.sleep(0.25)
            still_open = sum(not closed(s) for s in held)
            served = httpx.post(
                f"{url}/v1/sessions/agent:beta:s/calls",
                headers=B,
                json={"tool": "read", "args": {"path": "none.txt"}},
                timeout=10,
            )
        finally:
            stop.set()
            for s in held:
                s.close()
    print(f"20 trickled bodies: {still_open} open after the body timeout; globex then {served.status_code}")
    assert still_open == 0
    assert served.status_code == 200 and served.json()["error"]["code"] == "FILE_NOT_FOUND", served.text


@pytest.mark.slow
def test_a_tenant_reads_a_bounded_number_of_bodies_at_once(tmp_path: Path) -> None:
    """12 of acme's calls trickle their bodies (a long body timeout here): at most
    BODIES_PER_TENANT of them are being read at once, the others wait for a slot (they each
    held up to 40 MiB of buffer, unbounded); globex's call is read and answered meanwhile."""
    import uvicorn

    from sandbox.api.app import create_app
    from sandbox.api.limits import BODIES_PER_TENANT
    from sandbox.api.serving import uvicorn_config

    app = create_app(config(tmp_path, "{body_timeout_s: 60}"))
    server = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    stop = threading.Event()
    held: list[socket.socket] = []
    try:
        held = [trickle(url, A, stop) for _ in range(12)]
        deadline = time.monotonic() + 10
        most = 0
        while time.monotonic() < deadline and most < BODIES_PER_TENANT:
            most = max(most, app.state.limits.bodies("acme"))
            time.sleep(0.05)
        served = httpx.post(
            f"{url}/v1/sessions/agent:beta:s/calls", headers=B, json={"tool": "read", "args": {"path": "n"}}, timeout=10
        )
        for _ in range(20):  # still no more than the bound, however long they trickle
            most = max(most, app.state.limits.bodies("acme"))
            time.sleep(0.05)
    finally:
        stop.set()
        for s in held:
            s.close()
        server.should_exit = True
        thread.join(30)
    print(f"12 trickled bodies of acme: at most {most} read at once; globex's call {served.status_code}")
    assert most == BODIES_PER_TENANT
    assert served.status_code == 200, served.text
