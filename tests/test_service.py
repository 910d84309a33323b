"""The HTTP service driven by a real client over loopback: auth, tenancy, the floor, quotas.

Agents run in mode off here (no containers): the tenant boundary is the service's, not the
engine's. test_service_docker.py runs sandboxed sessions of two tenants against the engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.journal.store import Approval
from tests.cli_helpers import run_cli
from tests.service_helpers import TOKEN_A, TOKEN_B, serve, sha

A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}


def config(make_config: Any, tmp_path: Path, tenant_a: str = "", tenant_b: str = "") -> Any:
    return make_config(f"""
tools: {{profile: full}}
tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]{tenant_a}}}
  - {{id: globex, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]{tenant_b}}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: alpha, tenant: acme, default: true, workspace: "{tmp_path / "wa"}"}}
    - {{id: beta, tenant: globex, workspace: "{tmp_path / "wb"}"}}
""")


def test_every_route_needs_a_valid_bearer_token(make_config: Any, tmp_path: Path) -> None:
    """Missing, wrong, or non-bearer credentials are 401 with WWW-Authenticate; health is open."""
    with serve(config(make_config, tmp_path)) as url:
        assert httpx.get(f"{url}/healthz").json() == {"ok": True}
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN_A}"}):
            r = httpx.get(f"{url}/v1/agents", headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
        r = httpx.post(f"{url}/v1/sessions/agent:alpha:s/calls", json={"tool": "read", "args": {}})
        assert r.status_code == 401


def test_a_tenant_sees_and_calls_only_its_own(make_config: Any, tmp_path: Path) -> None:
    """Agents are listed per tenant; another tenant's agent, session or logs are 404 / absent."""
    with serve(config(make_config, tmp_path)) as url:
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


def test_tool_errors_are_tool_results_and_bad_requests_are_4xx(make_config: Any, tmp_path: Path) -> None:
    """An unknown tool is a ToolResult (200); bad JSON, bad keys and huge bodies are 4xx."""
    with serve(config(make_config, tmp_path)) as url:
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


def test_unsandboxed_sessions_only_when_the_tenant_allows(make_config: Any, tmp_path: Path) -> None:
    """globex (no allow_unsandboxed) is refused its own mode-off session: 403 saying why."""
    with serve(config(make_config, tmp_path)) as url:
        r = httpx.post(f"{url}/v1/sessions/agent:beta:s/calls", headers=B, json={"tool": "read", "args": {"path": "x"}})
        assert r.status_code == 403 and "allow_unsandboxed" in r.text


def test_the_tenant_floor_cannot_be_widened_below_it(make_config: Any, tmp_path: Path) -> None:
    """tenants[].tools narrows every agent of the tenant; explain shows the layer and its key."""
    cfg = config(make_config, tmp_path, tenant_a=", tools: {deny: [exec]}")
    with serve(cfg) as url:
        names = [t["function"]["name"] for t in httpx.get(f"{url}/v1/tools?session=agent:alpha:s", headers=A).json()]
        assert "exec" not in names and "read" in names
        denied = httpx.post(
            f"{url}/v1/sessions/agent:alpha:s/calls", headers=A, json={"tool": "exec", "args": {"command": "id"}}
        )
        assert denied.status_code == 200 and denied.json()["error"]["code"] == "TOOL_NOT_FOUND"
        explained = httpx.get(f"{url}/v1/explain?session=agent:alpha:s", headers=A).json()
        exec_row = next(t for t in explained["tools"] if t["name"] == "exec")
        assert exec_row["layer"] == "tenant" and exec_row["key"].startswith("tenants[0].tools")


def test_calls_per_minute_quota_is_429_with_retry_after(make_config: Any, tmp_path: Path) -> None:
    """Past max_calls_per_minute a tenant gets 429 and Retry-After; the other tenant is not slowed."""
    cfg = config(make_config, tmp_path, tenant_a=", quotas: {max_calls_per_minute: 2}")
    with serve(cfg) as url:
        call = {"tool": "read", "args": {"path": "none.txt"}}
        codes = [httpx.post(f"{url}/v1/sessions/agent:alpha:q/calls", headers=A, json=call) for _ in range(3)]
        assert [c.status_code for c in codes] == [200, 200, 429]
        assert int(codes[2].headers["retry-after"]) >= 1 and "max_calls_per_minute" in codes[2].text
        assert httpx.get(f"{url}/v1/agents", headers=B).status_code == 200


def test_approvals_of_another_tenant_are_not_found(make_config: Any, tmp_path: Path) -> None:
    """globex cannot list or decide acme's pending approval."""
    cfg = config(make_config, tmp_path)
    from sandbox.journal.store import Journal

    journal = Journal(cfg.state_dir / "journal.sqlite3")
    journal.add_approval(Approval("ap1", "c", "t", "agent:alpha:s", "alpha", "exec", {}, "pending", "", 0.0, None))
    journal.close()
    with serve(cfg) as url:
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
    ],
)
def test_tenant_config_errors_name_the_key(tmp_path: Path, text: str, words: str) -> None:
    """An agent of an undeclared tenant, or a tenant declared twice, is a config error at its key."""
    from sandbox.config import load_config_text
    from sandbox.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config_text(f"state_dir: {tmp_path}\n{text}\n")
    assert words in str(err.value)


def test_batches_and_metrics(make_config: Any, tmp_path: Path) -> None:
    """A batch runs through the engine's batches; /metrics counts calls by tool, code and tenant."""
    with serve(config(make_config, tmp_path)) as url:
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
        assert 'sandbox_calls_total{code="ok",tenant="acme",tool="write"} 1.0' in text
        assert 'sandbox_calls_total{code="ok",tenant="acme",tool="read"} 1.0' in text


def test_events_stream_the_sessions_progress(make_config: Any, tmp_path: Path) -> None:
    """GET .../events is server-sent events of that session's calls; another tenant gets 404."""
    import threading
    import time

    got: list[dict[str, Any]] = []
    connected = threading.Event()
    with serve(config(make_config, tmp_path)) as url:
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


def test_max_sessions_quota(make_config: Any, tmp_path: Path) -> None:
    """A tenant at max_sessions gets 429 for a new session until it closes one."""
    cfg = config(make_config, tmp_path, tenant_a=", quotas: {max_sessions: 2}")
    read = {"tool": "read", "args": {"path": "x.txt"}}
    with serve(cfg) as url:
        for key in ("agent:alpha:s1", "agent:alpha:s2", "agent:alpha:s1"):
            assert httpx.post(f"{url}/v1/sessions/{key}/calls", headers=A, json=read).status_code == 200
        third = httpx.post(f"{url}/v1/sessions/agent:alpha:s3/calls", headers=A, json=read)
        assert third.status_code == 429 and "max_sessions" in third.text
        assert httpx.delete(f"{url}/v1/sessions/agent:alpha:s1", headers=A).status_code == 200
        assert httpx.post(f"{url}/v1/sessions/agent:alpha:s3/calls", headers=A, json=read).status_code == 200


def test_a_refused_batch_is_400_not_a_server_error(make_config: Any, tmp_path: Path) -> None:
    """The fuzzer's find: a batch naming an unknown dependency was a 500; it is a 400 saying why."""
    with serve(config(make_config, tmp_path)) as url:
        r = httpx.post(
            f"{url}/v1/sessions/agent:alpha:b/batches",
            headers=A,
            json={"calls": [{"tool": "read", "args": {}, "depends_on": ["nope"]}]},
        )
        assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENTS" and "nope" in r.json()["detail"]
