"""MCP over HTTP behind a load balancer with no sticky sessions (`service.mcp_stateless`): every
request stands alone, so any replica answers it. Two real services on loopback share one state
dir and workspace (agents in mode off: no containers); a client's requests alternate between
them as a round-robin balancer would send them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service_helpers import TOKEN_A, TOKEN_B, serve, sha

A = {"Authorization": f"Bearer {TOKEN_A}"}
MCP = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}

pytestmark = pytest.mark.slow


def _config(tmp: Path, stateless: bool) -> Any:
    from sandbox.config import load_config_text

    return load_config_text(f"""
state_dir: {tmp / "state"}
tools: {{profile: full}}
service: {{mcp_stateless: {str(stateless).lower()}}}
tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: alpha, tenant: acme, default: true, workspace: "{tmp / "wa"}"}}
    - {{id: beta, tenant: globex, default: true, workspace: "{tmp / "wb"}"}}
""")


def _call(url: str, headers: dict[str, str], n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    answer = httpx.post(f"{url}/mcp/", headers={**headers, **MCP, "mcp-protocol-version": "2025-06-18"}, json=body)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def test_stateless_mcp_requests_are_answered_by_any_replica(tmp_path: Path) -> None:
    (tmp_path / "wa").mkdir()
    (tmp_path / "wb").mkdir()
    config = _config(tmp_path, stateless=True)
    with serve(config) as one, serve(config) as two:
        opened = httpx.post(f"{one}/mcp/", headers={**A, **MCP}, json=INIT, timeout=10)
        assert opened.status_code == 200, opened.text
        assert "mcp-session-id" not in opened.headers  # nothing to stick to
        listed = httpx.post(
            f"{two}/mcp/",
            headers={**A, **MCP, "mcp-protocol-version": "2025-06-18"},
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
        )
        assert listed.status_code == 200 and "write" in {t["name"] for t in listed.json()["result"]["tools"]}
        wrote = _call(one, A, 3, "write", {"path": "n.txt", "content": "via one"})
        assert wrote["result"]["isError"] is False, wrote
        read = _call(two, A, 4, "read", {"path": "n.txt"})  # the next request, on the other replica
        assert read["result"]["structuredContent"]["output"]["content"] == "via one", read
        # each request still names its tenant by its token: another tenant's request on the same
        # replica reaches its own agent's workspace, never acme's
        theirs = _call(two, {"Authorization": f"Bearer {TOKEN_B}"}, 5, "read", {"path": "n.txt"})
        assert theirs["result"]["isError"] is True and "FILE_NOT_FOUND" in theirs["result"]["content"][0]["text"]
        # no token: refused before the MCP layer
        assert httpx.post(f"{two}/mcp/", headers=MCP, json=INIT).status_code == 401


def test_a_stateful_session_is_one_replicas_only(tmp_path: Path) -> None:
    """Without mcp_stateless, the other replica does not know the session: why the option exists."""
    (tmp_path / "wa").mkdir()
    (tmp_path / "wb").mkdir()
    config = _config(tmp_path, stateless=False)
    with serve(config) as one, serve(config) as two:
        opened = httpx.post(f"{one}/mcp/", headers={**A, **MCP}, json=INIT, timeout=10)
        sid = opened.headers["mcp-session-id"]
        body = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        headers = {**A, **MCP, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
        assert httpx.post(f"{one}/mcp/", headers=headers, json=body).status_code == 200
        assert httpx.post(f"{two}/mcp/", headers=headers, json=body).status_code == 404


def test_stateless_mcp_holds_no_streams_and_takes_no_session_from_the_client(tmp_path: Path) -> None:
    """No GET stream to hold open per request, no DELETE; and an `mcp-session-id` a client
    makes up never names a sandbox session (requests land on `mcp-default`)."""
    (tmp_path / "wa").mkdir()
    (tmp_path / "wb").mkdir()
    config = _config(tmp_path, stateless=True)
    with serve(config) as one:
        for method in ("GET", "DELETE"):
            answer = httpx.request(method, f"{one}/mcp/", headers={**A, **MCP}, timeout=10)
            assert answer.status_code == 405 and answer.headers["allow"] == "POST", answer.text
        made_up = {**A, "mcp-session-id": "made-up-1"}
        wrote = _call(one, made_up, 1, "write", {"path": "m.txt", "content": "x"})
        assert wrote["result"]["isError"] is False, wrote
        logs = httpx.get(f"{one}/v1/logs", headers=A, timeout=10).json()
        sessions = {e["session"] for e in logs if e["call_id"] == wrote["result"]["structuredContent"]["call_id"]}
        assert sessions == {"agent:alpha:mcp-default"}, sessions
