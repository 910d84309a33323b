"""The HTTP service driven by a real client over loopback: auth, tenancy, the floor, quotas.

Agents run in mode off here (no containers): the tenant boundary is the service's, not the
engine's. test_service_docker.py runs sandboxed sessions of two tenants against the engine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import __version__
from sandbox.journal.store import Approval
from tests.cli_helpers import run_cli
from tests.service_helpers import TOKEN_A, TOKEN_B, serve, sha

A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}


TOKEN_F, TOKEN_L, TOKEN_S, TOKEN_M = "sbx_floor-token", "sbx_limited-token", "sbx_counted-token", "sbx_mcpq-token"
F, L, S, M = ({"Authorization": f"Bearer {t}"} for t in (TOKEN_F, TOKEN_L, TOKEN_S, TOKEN_M))


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One server for the tests that need no config of their own: a tenant per variation."""
    from sandbox.config import load_config_text

    tmp = tmp_path_factory.mktemp("service")
    cfg = load_config_text(f"""
state_dir: {tmp / "state"}
tools: {{profile: full}}
service: {{body_timeout_s: 5}}  # the slow-clients test's stalled bodies are cut sooner than the 30 s default
tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
  - {{id: floor, allow_unsandboxed: true, tools: {{deny: [exec]}}, tokens: [{{name: ci, sha256: {sha(TOKEN_F)}}}]}}
  - {{id: limited, allow_unsandboxed: true, quotas: {{max_calls_per_minute: 2}}, tokens: [{{name: ci, sha256: {sha(TOKEN_L)}}}]}}
  - {{id: counted, allow_unsandboxed: true, quotas: {{max_sessions: 2}}, tokens: [{{name: ci, sha256: {sha(TOKEN_S)}}}]}}
  - {{id: mcpq, allow_unsandboxed: true, quotas: {{max_calls_per_minute: 1}}, tokens: [{{name: ci, sha256: {sha(TOKEN_M)}}}]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: alpha, tenant: acme, workspace: "{tmp / "wa"}"}}
    - {{id: beta, tenant: globex, workspace: "{tmp / "wb"}"}}
    - {{id: gamma, tenant: floor, workspace: "{tmp / "wg"}"}}
    - {{id: delta, tenant: limited, workspace: "{tmp / "wd"}"}}
    - {{id: eps, tenant: counted, workspace: "{tmp / "we"}"}}
    - {{id: zeta, tenant: mcpq, workspace: "{tmp / "wz"}"}}
""")
    with serve(cfg) as url:
        yield url, cfg


@pytest.mark.slow
def test_every_route_needs_a_valid_bearer_token(shared: Any) -> None:
    """Missing, wrong, or non-bearer credentials are 401 with WWW-Authenticate; health is open."""
    url, _ = shared
    assert httpx.get(f"{url}/healthz").json() == {"ok": True, "version": __version__}
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN_A}"}):
        r = httpx.get(f"{url}/v1/agents", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
    r = httpx.post(f"{url}/v1/sessions/agent:alpha:s/calls", json={"tool": "read", "args": {}})
    assert r.status_code == 401


@pytest.mark.slow
def test_a_tenant_sees_and_calls_only_its_own(shared: Any) -> None:
    """Agents are listed per tenant; another tenant's agent, session or logs are 404 / absent."""
    url, _ = shared
    assert [a["id"] for a in httpx.get(f"{url}/v1/agents", headers=A).json()] == ["alpha"]
    assert [a["id"] for a in httpx.get(f"{url}/v1/agents", headers=B).json()] == ["beta"]
    ok = httpx.post(
        f"{url}/v1/sessions/agent:alpha:s1/calls",
        headers=A,
        json={"tool": "write", "args": {"path": "a.txt", "content": "acme data"}},
    )
    assert ok.status_code == 200 and ok.json()["ok"], ok.text
    stolen = httpx.post(
        f"{url}/v1/sessions/agent:alpha:s1/calls", headers=B, json={"tool": "read", "args": {"path": "a.txt"}}
    )
    missing = httpx.post(
        f"{url}/v1/sessions/agent:nobody:s1/calls", headers=B, json={"tool": "read", "args": {"path": "a.txt"}}
    )
    assert stolen.status_code == missing.status_code == 404
    assert "acme data" not in stolen.text
    via_param = httpx.post(
        f"{url}/v1/sessions/s1/calls", headers=B, json={"agent": "alpha", "tool": "read", "args": {"path": "a.txt"}}
    )
    assert via_param.status_code == 404
    for path in ("/v1/explain?session=agent:alpha:s1", "/v1/tools?session=agent:alpha:s1"):
        assert httpx.get(f"{url}{path}", headers=B).status_code == 404
    logs_b = httpx.get(f"{url}/v1/logs", headers=B).json()
    assert all(e["tenant"] == "globex" for e in logs_b) and not any("alpha" in json.dumps(e) for e in logs_b)
    assert any(e["session"] == "agent:alpha:s1" for e in httpx.get(f"{url}/v1/logs", headers=A).json())


@pytest.mark.slow
def test_tool_errors_are_tool_results_and_bad_requests_are_4xx(shared: Any) -> None:
    """An unknown tool is a ToolResult (200); bad JSON, bad keys and huge bodies are 4xx."""
    url, _ = shared
    r = httpx.post(f"{url}/v1/sessions/agent:alpha:s/calls", headers=A, json={"tool": "nope", "args": {}})
    assert r.status_code == 200 and r.json()["error"]["code"] == "TOOL_NOT_FOUND"
    bad_json = httpx.post(
        f"{url}/v1/sessions/agent:alpha:s/calls", headers={**A, "content-type": "application/json"}, content=b"{"
    )
    assert bad_json.status_code == 422
    bad_key = httpx.post(f"{url}/v1/sessions/agent:alpha:a..b/calls", headers=A, json={"tool": "read"})
    assert bad_key.status_code == 400 and ".." in bad_key.text
    huge = httpx.post(
        f"{url}/v1/sessions/agent:alpha:s/calls",
        headers={**A, "content-type": "application/json"},
        content=b" " * (41 * 1024 * 1024),
    )
    assert huge.status_code == 413


def test_unsandboxed_sessions_only_when_the_tenant_allows(shared: Any) -> None:
    """globex (no allow_unsandboxed) is refused its own mode-off session: 403 saying why."""
    url, _ = shared
    r = httpx.post(f"{url}/v1/sessions/agent:beta:s/calls", headers=B, json={"tool": "read", "args": {"path": "x"}})
    assert r.status_code == 403 and "allow_unsandboxed" in r.text


@pytest.mark.slow
def test_the_tenant_floor_cannot_be_widened_below_it(shared: Any) -> None:
    """tenants[].tools narrows every agent of the tenant; explain shows the layer and its key."""
    url, _ = shared
    names = [t["function"]["name"] for t in httpx.get(f"{url}/v1/tools?session=agent:gamma:s", headers=F).json()]
    assert "exec" not in names and "read" in names
    denied = httpx.post(
        f"{url}/v1/sessions/agent:gamma:s/calls", headers=F, json={"tool": "exec", "args": {"command": "id"}}
    )
    assert denied.status_code == 200 and denied.json()["error"]["code"] == "TOOL_NOT_FOUND"
    explained = httpx.get(f"{url}/v1/explain?session=agent:gamma:s", headers=F).json()
    exec_row = next(t for t in explained["tools"] if t["name"] == "exec")
    assert exec_row["layer"] == "tenant" and exec_row["key"].startswith("tenants[2].tools")


@pytest.mark.slow
def test_calls_per_minute_quota_is_429_with_retry_after(shared: Any) -> None:
    """Past max_calls_per_minute a tenant gets 429 and Retry-After; the other tenant is not slowed."""
    url, _ = shared
    call = {"tool": "read", "args": {"path": "none.txt"}}
    codes = [httpx.post(f"{url}/v1/sessions/agent:delta:q/calls", headers=L, json=call) for _ in range(3)]
    assert [c.status_code for c in codes] == [200, 200, 429]
    assert int(codes[2].headers["retry-after"]) >= 1 and "max_calls_per_minute" in codes[2].text
    assert httpx.post(f"{url}/v1/sessions/agent:alpha:q/calls", headers=A, json=call).status_code == 200


def test_approvals_of_another_tenant_are_not_found(shared: Any) -> None:
    """globex cannot list or decide acme's pending approval."""
    from sandbox.journal.store import Journal

    url, cfg = shared
    journal = Journal(cfg.state_dir / "journal.sqlite3")
    journal.add_approval(Approval("ap1", "c", "t", "agent:alpha:s", "alpha", "exec", {}, "pending", "", 0.0, None))
    journal.close()
    assert [a["id"] for a in httpx.get(f"{url}/v1/approvals", headers=A).json()] == ["ap1"]
    assert httpx.get(f"{url}/v1/approvals", headers=B).json() == []
    assert httpx.post(f"{url}/v1/approvals/ap1/approve", headers=B).status_code == 404
    assert httpx.post(f"{url}/v1/approvals/ap1/deny", headers=A).json()["status"] == "denied"


def test_token_create_prints_once_and_stores_only_the_hash(make_config: Any, tmp_path: Path) -> None:
    """`sandbox tenants token create` prints a token that authenticates; the file has only its hash."""
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(
        f"state_dir: {tmp_path / 'state'}\ntenants: [{{id: acme}}]\nagents: {{list: [{{id: a, tenant: acme}}]}}\n"
    )
    made = run_cli("--config", str(cfg_path), "tenants", "token", "create", "acme", "--name", "laptop", "--json")
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    stored = (tmp_path / "state" / "tenant-tokens.json").read_text()
    assert token not in stored and sha(token) in stored
    assert oct((tmp_path / "state" / "tenant-tokens.json").stat().st_mode)[-3:] == "600"
    from sandbox import load_config
    from sandbox.api.tenants import authenticate

    who = authenticate(load_config(cfg_path), token)
    assert who is not None and who.tenant.id == "acme" and who.token_name == "laptop"
    again = run_cli("--config", str(cfg_path), "tenants", "token", "create", "nobody")
    assert again.returncode == 2 and "unknown tenant" in again.stderr


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("tenants: [{id: acme}]\nagents: {list: [{id: a, tenant: other}]}", "not in tenants"),
        ("tenants: [{id: acme}, {id: acme}]\nagents: {list: [{id: a, tenant: acme}]}", "declared twice"),
        (
            f"tenants: [{{id: a1, tokens: [{{name: x, sha256: {'a' * 64}}}]}}, "
            f"{{id: a2, tokens: [{{name: y, sha256: {'a' * 64}}}]}}]\nagents: {{list: [{{id: a, tenant: a1}}]}}",
            "used twice",
        ),
        (
            f"tenants: [{{id: a1, tokens: [{{name: x, sha256: {'b' * 64}}}]}}]\n"
            f"service: {{metrics_tokens: [{{name: prom, sha256: {'b' * 64}}}]}}\nagents: {{list: [{{id: a, tenant: a1}}]}}",
            "service.metrics_tokens[0].sha256",
        ),
    ],
)
def test_tenant_config_errors_name_the_key(tmp_path: Path, text: str, words: str) -> None:
    """An agent of an undeclared tenant, or a tenant declared twice, is a config error at its key."""
    from sandbox.config import load_config_text
    from sandbox.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config_text(f"state_dir: {tmp_path}\n{text}\n")
    assert words in str(err.value)


@pytest.mark.slow
def test_batches_and_metrics(shared: Any) -> None:
    """A batch runs through the engine's batches; /metrics counts calls by tool, code and tenant."""
    url, _ = shared
    r = httpx.post(
        f"{url}/v1/sessions/agent:alpha:b/batches",
        headers=A,
        json={
            "mode": "sequential",
            "calls": [
                {"id": "w", "tool": "write", "args": {"path": "b.txt", "content": "batched"}},
                {"id": "r", "tool": "read", "args": {"path": "b.txt"}, "depends_on": ["w"]},
            ],
        },
    )
    assert r.status_code == 200 and r.json()["status"] == "SUCCESS", r.text
    assert "batched" in json.dumps(r.json()["results"][1])
    empty = httpx.post(f"{url}/v1/sessions/agent:alpha:b/batches", headers=A, json={"calls": []})
    assert empty.status_code == 422
    text = httpx.get(f"{url}/metrics").text
    assert 'sandbox_calls_total{code="ok",tenant="acme",tool="write"}' in text
    assert 'sandbox_calls_total{code="ok",tenant="acme",tool="read"}' in text


@pytest.mark.slow
def test_events_stream_the_sessions_progress(shared: Any) -> None:
    """GET .../events is server-sent events of that session's calls; another tenant gets 404."""
    import threading
    import time

    got: list[dict[str, Any]] = []
    connected = threading.Event()
    url, _ = shared
    assert httpx.get(f"{url}/v1/sessions/agent:alpha:ev/events", headers=B).status_code == 404

    def listen() -> None:
        with httpx.stream("GET", f"{url}/v1/sessions/agent:alpha:ev/events", headers=A, timeout=30) as r:
            for line in r.iter_lines():
                connected.set()
                if line.startswith("data:"):
                    got.append(json.loads(line[5:]))
                    if got[-1]["kind"] == "finished":
                        return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert connected.wait(10)
    time.sleep(0.2)
    r = httpx.post(
        f"{url}/v1/sessions/agent:alpha:ev/calls", headers=A, json={"tool": "exec", "args": {"command": "echo hi"}}
    )
    call_id = r.json()["call_id"]
    thread.join(15)
    kinds = [e["kind"] for e in got if e["call_id"] == call_id]
    assert kinds and kinds[-1] == "finished", got


@pytest.mark.slow
def test_max_sessions_quota(shared: Any) -> None:
    """A tenant at max_sessions gets 429 for a new session until it closes one."""
    url, _ = shared
    read = {"tool": "read", "args": {"path": "x.txt"}}
    for key in ("agent:eps:s1", "agent:eps:s2", "agent:eps:s1"):
        assert httpx.post(f"{url}/v1/sessions/{key}/calls", headers=S, json=read).status_code == 200
    third = httpx.post(f"{url}/v1/sessions/agent:eps:s3/calls", headers=S, json=read)
    assert third.status_code == 429 and "max_sessions" in third.text
    assert httpx.delete(f"{url}/v1/sessions/agent:eps:s1", headers=S).status_code == 200
    assert httpx.post(f"{url}/v1/sessions/agent:eps:s3/calls", headers=S, json=read).status_code == 200


def test_a_refused_batch_is_400_not_a_server_error(shared: Any) -> None:
    """The fuzzer's find: a batch naming an unknown dependency was a 500; it is a 400 saying why."""
    url, _ = shared
    r = httpx.post(
        f"{url}/v1/sessions/agent:alpha:b/batches",
        headers=A,
        json={"calls": [{"tool": "read", "args": {}, "depends_on": ["nope"]}]},
    )
    assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENTS" and "nope" in r.json()["detail"]


async def _mcp_names_and_call(url: str, headers: dict[str, str]) -> tuple[set[str], Any]:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"{url}/mcp/", http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        names = {t.name for t in (await client.list_tools()).tools}
        result = await client.call_tool("write", {"path": "via-mcp.txt", "content": "mcp"})
        return names, result


@pytest.mark.slow
def test_mcp_over_http_serves_the_tenants_session(shared: Any) -> None:
    """/mcp (streamable HTTP, the official client): the token's tenant, its session's tools, calls
    through the engine; another tenant's agent is refused; no token is 401."""
    import anyio

    url, cfg = shared
    names, result = anyio.run(_mcp_names_and_call, url, {**A, "X-Sandbox-Session": "agent:alpha:m1"})
    assert "write" in names and not result.is_error, result
    assert (cfg.agents.list[0].workspace / "via-mcp.txt").read_text() == "mcp"
    floor_names, _ = anyio.run(_mcp_names_and_call, url, {**F, "X-Sandbox-Session": "agent:gamma:m1"})
    assert "exec" not in floor_names and "read" in floor_names  # the tenant floor holds here too
    with pytest.raises(BaseException) as refused:
        anyio.run(_mcp_names_and_call, url, {**B, "X-Sandbox-Agent": "alpha"})
    assert "no agent 'alpha'" in repr(refused.value)  # the MCP error carries the refusal
    assert httpx.post(f"{url}/mcp/", json={}).status_code == 401


def read_response(sock: Any) -> str:
    """One whole HTTP/1.1 response: the head and the body may come in separate segments."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    assert length, head
    while len(body) < int(length.group(1)):
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {data!r}"
        body += chunk
    return (head + b"\r\n\r\n" + body).decode()


@pytest.mark.slow
def test_slow_clients_do_not_hold_up_the_others(shared: Any) -> None:
    """Twenty connections that send their headers and then dribble (or stall) the body hold
    nothing another tenant needs: its calls are answered meanwhile, and a dribbled body that
    completes gets its ordinary answer."""
    import socket
    import time

    url, _ = shared
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"tool": "read", "args": {"path": "none.txt"}}).encode()
    head = (
        f"POST /v1/sessions/agent:alpha:slow/calls HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {TOKEN_A}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    stalled = []
    try:
        for _ in range(20):
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(head + body[:5])  # and never the rest
            stalled.append(s)
        dribbler = socket.create_connection((host, int(port)), timeout=30)
        stalled.append(dribbler)
        dribbler.sendall(head)
        for i in range(len(body)):  # one byte at a time, while the other tenant calls
            dribbler.sendall(body[i : i + 1])
            if i % 10 == 0:  # another tenant is answered meanwhile (a stuck server times out here)
                r = httpx.post(
                    f"{url}/v1/sessions/agent:gamma:fast/calls",
                    headers=F,
                    json={"tool": "read", "args": {"path": "none.txt"}},
                    timeout=10,
                )
                assert r.status_code == 200 and r.json()["error"]["code"] == "FILE_NOT_FOUND", r.text
            time.sleep(0.01)
        answer = read_response(dribbler)
        assert answer.startswith("HTTP/1.1 200"), answer[:200]
        assert '"FILE_NOT_FOUND"' in answer
    finally:
        for s in stalled:
            s.close()


@pytest.mark.slow
def test_mcp_calls_count_toward_the_tenants_quotas(shared: Any) -> None:
    """A tenant at its calls-per-minute quota is refused over /mcp as over REST (it used to be a
    way around every quota)."""
    import anyio

    url, _ = shared
    headers = {**M, "X-Sandbox-Session": "agent:zeta:m"}
    names, first = anyio.run(_mcp_names_and_call, url, headers)
    assert "write" in names and not first.is_error, first
    with pytest.raises(BaseException) as refused:
        anyio.run(_mcp_names_and_call, url, headers)
    assert "max_calls_per_minute" in repr(refused.value)
    rest = httpx.post(f"{url}/v1/sessions/agent:zeta:m/calls", headers=M, json={"tool": "read", "args": {"path": "x"}})
    assert rest.status_code == 429  # one budget for both doors


@pytest.mark.slow
def test_not_ready_names_what_is_missing(tmp_path: Path) -> None:
    """/readyz is 503 when the default agent's image is not on the engine (or no engine answers),
    and says which check failed and what to do; /healthz (the process) stays 200."""
    from sandbox.config import load_config_text

    cfg = load_config_text(f"""
state_dir: {tmp_path / "state"}
tenants: [{{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]
agents:
  defaults: {{sandbox: {{docker: {{image: "sandbox-never-built-{tmp_path.name}:none"}}}}}}
  list: [{{id: alpha, tenant: acme, workspace: "{tmp_path / "wa"}"}}]
""")
    with serve(cfg) as url:
        r = httpx.get(f"{url}/readyz", timeout=30)
        assert r.status_code == 503
        body = r.json()
        assert body["ready"] is False and body["checks"]["journal"] == "ok"
        assert body["checks"]["engine"].startswith("failed: ")
        assert httpx.get(f"{url}/healthz").json() == {"ok": True, "version": __version__}
