"""Per-tenant bounds on what the service holds for a tenant, and its reads: MCP sessions (bound
to the tenant and token that opened them, bounded, expiring), event streams, the read routes'
rate, metric labels, the logs page, and a readiness probe against an engine that never answers.
The service runs for real on loopback (agents in mode off: no containers)."""

from __future__ import annotations

import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service_helpers import TOKEN_A, TOKEN_B, serve, sha

TOKEN_A2 = "sbx_second-token-of-tenant-a"
A = {"Authorization": f"Bearer {TOKEN_A}"}
A2 = {"Authorization": f"Bearer {TOKEN_A2}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}
MCP = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}


def config(tmp: Path, service: str) -> Any:
    from sandbox.config import load_config_text

    return load_config_text(f"""
state_dir: {tmp / "state"}
tools: {{profile: full}}
service: {service}
tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}, {{name: two, sha256: {sha(TOKEN_A2)}}}]}}
  - {{id: globex, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: alpha, tenant: acme, default: true, workspace: "{tmp / "wa"}"}}
    - {{id: beta, tenant: globex, workspace: "{tmp / "wb"}"}}
""")


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with small bounds: 2 MCP sessions and 2 event streams per tenant, 6 reads a minute."""
    tmp = tmp_path_factory.mktemp("bounded")
    bounds = "{max_mcp_sessions_per_tenant: 2, mcp_session_idle_s: 3, max_event_streams_per_tenant: 2, read_requests_per_minute: 6}"
    with serve(config(tmp, bounds)) as url:
        yield url


def open_mcp(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/mcp/", headers={**headers, **MCP}, json=INIT, timeout=10)


def on_session(url: str, headers: dict[str, str], sid: str, method: str = "POST") -> httpx.Response:
    h = {**headers, **MCP, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
    if method == "DELETE":
        return httpx.delete(f"{url}/mcp/", headers=h, timeout=10)
    return httpx.post(f"{url}/mcp/", headers=h, json=LIST, timeout=10)


@pytest.mark.slow
def test_an_mcp_session_belongs_to_the_tenant_and_token_that_opened_it(bounded: str) -> None:
    """Another tenant's token on acme's MCP session is 404 for every method (it could end the
    session before); so is acme's own second token; acme's session goes on working."""
    opened = open_mcp(bounded, A)
    assert opened.status_code == 200, opened.text
    sid = opened.headers["mcp-session-id"]
    for other in (B, A2):
        assert on_session(bounded, other, sid).status_code == 404
        assert on_session(bounded, other, sid, "DELETE").status_code == 404
        # acme's own request after each probe: the session is alive, and stays so (it expires
        # after 3 s idle here, which a loaded machine reached across all four probes at once)
        assert on_session(bounded, A, sid).status_code == 200
    assert on_session(bounded, A, sid, "DELETE").status_code in (200, 204)


@pytest.mark.slow
def test_mcp_sessions_are_bounded_per_tenant_and_idle_ones_expire(bounded: str) -> None:
    """Past max_mcp_sessions_per_tenant a new MCP session is 429 for that tenant only; an idle
    session ends after mcp_session_idle_s (its id is then 404) and frees its place."""
    sids = []
    for _ in range(2):
        opened = open_mcp(bounded, A)
        assert opened.status_code == 200, opened.text
        sids.append(opened.headers["mcp-session-id"])
    third = open_mcp(bounded, A)
    assert third.status_code == 429 and "max_mcp_sessions_per_tenant" in third.text
    theirs = open_mcp(bounded, B)
    assert theirs.status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and on_session(bounded, A, sids[0]).status_code != 404:
        time.sleep(3.5)  # a request keeps it alive: ask less often than it expires
    assert on_session(bounded, A, sids[0]).status_code == 404
    assert open_mcp(bounded, A).status_code == 200


def open_stream(url: str, headers: dict[str, str], key: str) -> tuple[socket.socket, str]:
    """Open an event stream on a raw socket; returns it and the status line."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    auth = headers["Authorization"]
    s.sendall(f"GET /v1/sessions/{key}/events HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n\r\n".encode())
    return s, s.recv(4096).decode(errors="replace")


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_event_streams_are_bounded_per_tenant(bounded: str) -> None:
    """A tenant's third event stream is 429 (each held a subscription and a buffer, unbounded);
    another tenant still gets one; a closed stream gives its place back."""
    first, status = open_stream(bounded, A, "agent:alpha:e1")
    second, status2 = open_stream(bounded, A, "agent:alpha:e2")
    try:
        assert status.startswith("HTTP/1.1 200") and status2.startswith("HTTP/1.1 200"), (status, status2)
        third, status3 = open_stream(bounded, A, "agent:alpha:e3")
        third.close()
        assert status3.startswith("HTTP/1.1 429") and "max_event_streams_per_tenant" in status3, status3
        theirs, status_b = open_stream(bounded, B, "agent:beta:e1")
        theirs.close()
        assert status_b.startswith("HTTP/1.1 200")
    finally:
        first.close()
    deadline = time.monotonic() + 20
    status4 = ""
    while time.monotonic() < deadline:  # the server notices the closed stream within a second
        again, status4 = open_stream(bounded, A, "agent:alpha:e4")
        again.close()
        if status4.startswith("HTTP/1.1 200"):
            break
        time.sleep(0.5)
    second.close()
    assert status4.startswith("HTTP/1.1 200"), status4


@pytest.mark.slow
def test_read_routes_are_rate_limited_per_tenant(bounded: str) -> None:
    """logs, explain and tools count toward service.read_requests_per_minute (6 here): the
    seventh is 429 with Retry-After; the other tenant's reads are its own."""
    paths = ["/v1/logs", "/v1/explain?session=agent:alpha:r", "/v1/tools?session=agent:alpha:r"] * 2
    assert [httpx.get(f"{bounded}{p}", headers=A2).status_code for p in paths] == [200] * 6
    past = httpx.get(f"{bounded}/v1/logs", headers=A)
    assert past.status_code == 429 and int(past.headers["retry-after"]) >= 1
    assert "read_requests_per_minute" in past.text
    assert httpx.get(f"{bounded}/v1/logs", headers=B).status_code == 200


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("plain")
    with serve(config(tmp, "{}")) as url:
        yield url


@pytest.mark.slow
def test_metric_labels_come_from_a_bounded_set(plain: str) -> None:
    """A batch of 64 made-up tool names makes one `unknown` series, not 64 new ones."""
    calls = [{"tool": f"made-up-{i}", "args": {}} for i in range(64)]
    r = httpx.post(f"{plain}/v1/sessions/agent:alpha:m/batches", headers=A, json={"calls": calls})
    assert r.status_code == 200, r.text
    text = httpx.get(f"{plain}/metrics").text
    assert "made-up" not in text
    assert 'sandbox_calls_total{code="TOOL_NOT_FOUND",tenant="acme",tool="unknown"} 64.0' in text
    series = [line for line in text.splitlines() if line.startswith("sandbox_calls_total{")]
    print(f"metrics: {len(text.splitlines())} lines, {len(series)} sandbox_calls_total series after 64 made-up tools")
    assert len(series) <= 4


@pytest.mark.slow
def test_logs_are_the_tenants_own_newest_first_with_a_cursor(plain: str) -> None:
    """A busy neighbour's events (written first) never crowd a tenant's page: acme's page is
    acme's events, newest first, and X-Next-Cursor walks back through all of them."""
    neighbour = {"tool": "read", "args": {"path": "none.txt"}}
    for _ in range(40):
        httpx.post(f"{plain}/v1/sessions/agent:beta:busy/calls", headers=B, json=neighbour)
    for i in range(3):
        httpx.post(
            f"{plain}/v1/sessions/agent:alpha:mine/calls", headers=A, json={"tool": "read", "args": {"path": f"{i}"}}
        )
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 4, "session": "agent:alpha:mine"}
        if cursor:
            params["cursor"] = cursor
        r = httpx.get(f"{plain}/v1/logs", headers=A, params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        pages += 1
        assert page and len(page) <= 4
        seen += page
        cursor = r.headers.get("x-next-cursor")
        if not cursor:
            break
    assert all(e["tenant"] == "acme" and e["session"] == "agent:alpha:mine" for e in seen)
    assert [e["id"] for e in seen] == sorted((e["id"] for e in seen), reverse=True)
    assert {e["data"].get("arguments", {}).get("path") for e in seen if e["stage"] == "proposed"} >= {"0", "1", "2"}
    first = httpx.get(f"{plain}/v1/logs", headers=A, params={"limit": 100}).json()
    assert first and all(e["tenant"] == "acme" for e in first)
    assert first[0]["id"] == max(e["id"] for e in first)
    print(f"logs: {len(seen)} events of acme's session in {pages} pages of 4")


class HungEngine:
    """A Unix socket that accepts every connection and never answers (a hung dockerd)."""

    def __init__(self, path: Path) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(64)
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.server.close()
        for conn in self.conns:
            conn.close()


@pytest.mark.slow
def test_readyz_answers_503_within_its_bound_when_the_engine_never_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/readyz against an engine that accepts connections and never answers is 503 naming the
    engine within the probe's bound (it waited for the engine's own 15-60 s before), while other
    requests are answered meanwhile."""
    path = Path(f"/tmp/sbx-readyz-{time.monotonic_ns() % 10**8}.sock")
    engine = HungEngine(path)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            with serve(config(tmp_path, "{}")) as url:
                answers: list[httpx.Response] = []
                probe = threading.Thread(target=lambda: answers.append(httpx.get(f"{url}/readyz", timeout=10)))
                started = time.monotonic()
                probe.start()
                assert httpx.get(f"{url}/v1/agents", headers=A, timeout=5).status_code == 200
                probe.join(15)
                took = time.monotonic() - started
                again = httpx.get(f"{url}/readyz", timeout=10)
        print(
            f"/readyz against a hung engine: {answers[0].status_code if answers else None} after {took:.2f} s",
            answers[0].text if answers else "",
        )
        assert answers and answers[0].status_code == 503, answers
        body = answers[0].json()
        assert body["checks"]["journal"] == "ok" and body["checks"]["engine"].startswith("failed: ")
        assert again.status_code == 503
    finally:
        engine.close()
        path.unlink(missing_ok=True)
