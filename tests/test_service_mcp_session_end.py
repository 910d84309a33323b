"""An MCP session that ends gives back what it held: the orchestrator session it used under its
default key (`mcp-<id>`) is closed and its `max_sessions` place is free again, whether the
client ended it (DELETE) or it expired idle. The service runs for real on loopback (agents in
mode off: no containers)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.service_helpers import TOKEN_A, serve, sha

A = {"Authorization": f"Bearer {TOKEN_A}"}
MCP = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "read", "arguments": {"path": "n.txt"}}}
IDLE_S = 2


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from sandbox.config import load_config_text

    tmp = tmp_path_factory.mktemp("mcp-end")
    (tmp / "wa").mkdir()
    config = load_config_text(f"""
state_dir: {tmp / "state"}
tools: {{profile: full}}
service: {{mcp_session_idle_s: {IDLE_S}}}
tenants:
  - {{id: acme, allow_unsandboxed: true, quotas: {{max_sessions: 1}}, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: alpha, tenant: acme, default: true, workspace: "{tmp / "wa"}"}}
""")
    with serve(config) as running:
        yield running


def open_session(url: str) -> str:
    opened = httpx.post(f"{url}/mcp/", headers={**A, **MCP}, json=INIT, timeout=10)
    assert opened.status_code == 200, opened.text
    return opened.headers["mcp-session-id"]


def on(url: str, sid: str) -> dict[str, str]:
    return {**A, **MCP, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}


def call(url: str, sid: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/mcp/", headers=on(url, sid), json=CALL, timeout=30)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def ran(answer: dict[str, Any]) -> bool:
    """The call ran (a tool result, here FILE_NOT_FOUND), not a refusal (a JSON-RPC error)."""
    return "result" in answer and "error" not in answer


@pytest.mark.slow
def test_an_ended_mcp_session_gives_its_session_place_back(url: str) -> None:
    """max_sessions 1: MCP session 1 calls and is ended with DELETE; MCP session 2's call runs
    (it was refused for max_sessions: the place of `mcp-<id1>` was never given back, and MCP
    and REST alike were locked out). The REST route has the place too once session 2 ends."""
    first = open_session(url)
    assert ran(call(url, first))
    assert httpx.delete(f"{url}/mcp/", headers=on(url, first), timeout=10).status_code in (200, 204)
    second = open_session(url)
    answer = call(url, second)
    print("MCP session 2 after session 1's DELETE:", answer.get("error") or "ran")
    assert ran(answer), answer
    assert httpx.delete(f"{url}/mcp/", headers=on(url, second), timeout=10).status_code in (200, 204)
    rest = httpx.post(
        f"{url}/v1/sessions/agent:alpha:rest/calls", headers=A, json={"tool": "read", "args": {"path": "n.txt"}}
    )
    assert rest.status_code == 200, rest.text
    assert httpx.delete(f"{url}/v1/sessions/agent:alpha:rest", headers=A).status_code == 200


@pytest.mark.slow
def test_an_mcp_session_that_expires_idle_gives_its_session_place_back(url: str) -> None:
    """The same when the session is not ended but left idle past mcp_session_idle_s."""
    first = open_session(url)
    assert ran(call(url, first))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # a request keeps it alive: ask less often than it expires
        time.sleep(IDLE_S + 0.5)
        if httpx.post(f"{url}/mcp/", headers=on(url, first), json=CALL, timeout=10).status_code == 404:
            break
    else:
        raise AssertionError("the idle MCP session never expired")
    second = open_session(url)
    answer = call(url, second)
    # its id is 404 as soon as it expired; the clean-up that gives the place back follows it
    deadline = time.monotonic() + 10
    while not ran(answer) and time.monotonic() < deadline:
        time.sleep(0.2)
        answer = call(url, second)
    print("MCP session 2 after session 1 expired idle:", answer.get("error") or "ran")
    assert ran(answer), answer
    assert httpx.delete(f"{url}/mcp/", headers=on(url, second), timeout=10).status_code in (200, 204)


@pytest.mark.slow
def test_an_mcp_quota_refusal_is_logged_without_a_traceback(url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A tools/call refused by a quota is an MCP error with the REST route's words, and the
    service's own log line: the SDK logged each one as an ERROR with a traceback ("handler for
    'tools/call' raised"), as if the service had crashed."""
    first = open_session(url)
    try:
        assert ran(call(url, first))  # holds acme's one session place
        named = {**on(url, first), "x-sandbox-session": "agent:alpha:another"}
        with caplog.at_level("INFO"):
            r = httpx.post(f"{url}/mcp/", headers=named, json=CALL, timeout=30)
        error = r.json()["error"]
        assert "max_sessions" in error["message"]
        crashes = [rec for rec in caplog.records if rec.levelname == "ERROR" or rec.exc_info]
        assert crashes == [], [rec.getMessage() for rec in crashes]
    finally:
        httpx.delete(f"{url}/mcp/", headers=on(url, first), timeout=10)


@pytest.mark.slow
@pytest.mark.anyio
async def test_an_ended_mcp_session_removes_its_session_sandbox(make_config: Any) -> None:
    """With session-scoped sandboxes (the library's fake backend): the sandbox an MCP session's
    calls made under its default key goes when the session is ended (it stayed, counted toward
    max_sandboxes, until a restart's clean-up)."""
    from sandbox import Orchestrator
    from sandbox.api.app import create_app
    from sandbox.testing import FakeBackend
    from tests.service_helpers import serving

    config = make_config(f"""
tools: {{profile: full}}
tenants:
  - {{id: acme, quotas: {{max_sessions: 1, max_sandboxes: 1}}, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
    - {{id: alpha, tenant: acme, default: true}}
""")
    backend = FakeBackend()
    exec_call = {**CALL, "params": {"name": "exec", "arguments": {"command": "true"}}}
    async with (
        Orchestrator(config, backend=backend) as orch,
        serving(create_app(config, orch)) as base,
        httpx.AsyncClient(base_url=base, timeout=30) as client,
    ):
        for round_ in range(2):
            opened = await client.post("/mcp/", headers={**A, **MCP}, json=INIT)
            sid = opened.headers["mcp-session-id"]
            answer = (await client.post("/mcp/", headers=on(base, sid), json=exec_call)).json()
            assert ran(answer), (round_, answer)
            boxes = [b.spec.session for b in backend.sandboxes.values() if b.spec.tenant == "acme"]
            assert boxes == [f"agent:alpha:mcp-{sid}"], boxes
            assert (await client.delete("/mcp/", headers=on(base, sid))).status_code in (200, 204)
            left = [b.spec.session for b in backend.sandboxes.values() if b.spec.tenant == "acme"]
            assert left == [], left
