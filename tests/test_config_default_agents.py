"""Every tenant can have its own default agent: at most one `default: true` per tenant, and a call
that names no agent runs as its tenant's default (else its only agent, else an error listing the
tenant's agents), in the library, the CLI, the service and MCP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import load_config_text
from sandbox.config.merge import default_agent_id, probe_agent_id
from sandbox.errors import ConfigError, UsageError
from tests.cli_helpers import run_cli
from tests.service_helpers import TOKEN_A, TOKEN_B, serve, sha

TOKEN_C = "sbx_test-token-of-tenant-c"


def config(tmp_path: Path) -> Any:
    return load_config_text(f"""
state_dir: {tmp_path / "state"}
tools: {{profile: full}}
tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
  - {{id: initech, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_C)}}}]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: omega, tenant: acme, workspace: "{tmp_path / "omega"}"}}
    - {{id: alpha, tenant: acme, default: true, workspace: "{tmp_path / "alpha"}"}}
    - {{id: beta, tenant: globex, default: true, workspace: "{tmp_path / "beta"}"}}
    - {{id: gamma, tenant: globex, workspace: "{tmp_path / "gamma"}"}}
    - {{id: one, tenant: initech, workspace: "{tmp_path / "one"}"}}
    - {{id: two, tenant: initech, workspace: "{tmp_path / "two"}"}}
""")


def test_each_tenant_may_mark_its_own_default(tmp_path: Path) -> None:
    """Two tenants each with a `default: true` load (they used to be refused: "only one agent may
    be default"), and each tenant's default is its own."""
    cfg = config(tmp_path)
    assert default_agent_id(cfg, "acme") == "alpha"
    assert default_agent_id(cfg, "globex") == "beta"


def test_two_defaults_in_one_tenant_name_both_key_paths() -> None:
    """A second `default: true` in one tenant is a config error at the second, naming the first."""
    with pytest.raises(ConfigError) as info:
        load_config_text(
            "tenants: [{id: acme}, {id: globex}]\n"
            "agents: {list: [{id: a, tenant: acme, default: true}, {id: g, tenant: globex, default: true},\n"
            "  {id: b, tenant: acme, default: true}]}\n",
            source="cfg.yaml",
        )
    assert info.value.problems == [
        "cfg.yaml:3:34: agents.list[2].default: tenant 'acme' already has a default agent "
        "(agents.list[0].default); only one agent per tenant may be `default: true`"
    ]


def test_without_a_default_the_only_agent_else_an_error_listing_them(tmp_path: Path) -> None:
    """A tenant with no default: its only agent; with several, an error naming them (not a guess
    by position); a tenant without agents says so."""
    cfg = load_config_text(
        "tenants: [{id: solo}, {id: many}, {id: empty}]\n"
        "agents: {list: [{id: s, tenant: solo}, {id: m1, tenant: many}, {id: m2, tenant: many}]}\n"
    )
    assert default_agent_id(cfg, "solo") == "s"
    with pytest.raises(UsageError) as many:
        default_agent_id(cfg, "many")
    assert (
        "tenant 'many' has 2 agents (m1, m2)" in many.value.message and "none is `default: true`" in many.value.message
    )
    with pytest.raises(UsageError, match="tenant 'empty' has no agents"):
        default_agent_id(cfg, "empty")


def test_without_a_tenant_the_one_default_or_tenant_defaults_or_an_error(tmp_path: Path) -> None:
    """The library and the CLI act for no tenant: the one `default: true` when only one is; with
    several tenants' defaults, tenant `default`'s, else an error naming each tenant's default; no
    agents: the implicit `main`. A probe (doctor, /readyz) always gets an agent."""
    assert default_agent_id(load_config_text("{}")) == "main"
    one = load_config_text("agents: {list: [{id: a}, {id: b, default: true}]}")
    assert default_agent_id(one) == "b"
    cfg = config(tmp_path)
    with pytest.raises(UsageError) as info:
        default_agent_id(cfg)
    assert "the defaults are per tenant: alpha (tenant acme), beta (tenant globex)" in info.value.message
    assert probe_agent_id(cfg) == "alpha"
    home = load_config_text(
        "tenants: [{id: default}, {id: acme}]\n"
        "agents: {list: [{id: a, tenant: acme, default: true}, {id: d, tenant: default, default: true}]}\n"
    )
    assert default_agent_id(home) == "d" == probe_agent_id(home)


@pytest.mark.slow
def test_a_call_without_an_agent_lands_on_its_tenants_default(tmp_path: Path) -> None:
    """Through the real service, a call whose key names no agent runs as the caller's tenant's
    default (each in its own workspace); a tenant with several agents and no default gets a 400
    listing them, not a guess; naming the agent still works."""
    cfg = config(tmp_path)
    call = {"tool": "write", "args": {"path": "who.txt", "content": "x"}}
    with serve(cfg) as url:
        for token, agent in ((TOKEN_A, "alpha"), (TOKEN_B, "beta")):
            r = httpx.post(f"{url}/v1/sessions/t1/calls", headers={"Authorization": f"Bearer {token}"}, json=call)
            assert r.status_code == 200 and r.json()["ok"], r.text
            assert (tmp_path / agent / "who.txt").read_text() == "x"
        c = {"Authorization": f"Bearer {TOKEN_C}"}
        r = httpx.post(f"{url}/v1/sessions/t1/calls", headers=c, json=call)
        assert r.status_code == 400, r.text
        assert "tenant 'initech' has 2 agents (one, two)" in r.json()["detail"]
        r = httpx.post(f"{url}/v1/sessions/t1/calls", headers=c, json={**call, "agent": "two"})
        assert r.status_code == 200 and r.json()["ok"], r.text
    assert sorted(p.name for p in tmp_path.iterdir() if (p / "who.txt").exists()) == ["alpha", "beta", "two"]


@pytest.mark.slow
def test_mcp_without_an_agent_lands_on_its_tenants_default(tmp_path: Path) -> None:
    """/mcp without X-Sandbox-Agent uses the token's tenant's default agent too."""
    import anyio

    from tests.test_service import _mcp_names_and_call

    cfg = config(tmp_path)
    with serve(cfg) as url:
        for token, agent in ((TOKEN_A, "alpha"), (TOKEN_B, "beta")):
            headers = {"Authorization": f"Bearer {token}", "X-Sandbox-Session": "m1"}
            names, result = anyio.run(_mcp_names_and_call, url, headers)
            assert "write" in names and not result.is_error, result
            assert (tmp_path / agent / "via-mcp.txt").read_text() == "mcp"
        # a tenant with several agents and no default: an MCP error carrying REST's words
        with pytest.raises(BaseException) as refused:
            anyio.run(_mcp_names_and_call, url, {"Authorization": f"Bearer {TOKEN_C}", "X-Sandbox-Session": "m1"})
        assert "tenant 'initech' has 2 agents (one, two)" in repr(refused.value)
    assert not (tmp_path / "omega" / "via-mcp.txt").exists() and not (tmp_path / "gamma" / "via-mcp.txt").exists()


def test_the_cli_asks_for_the_agent_when_defaults_are_per_tenant(tmp_path: Path) -> None:
    """`sandbox call` with a key naming no agent, on a config whose defaults are per tenant, is a
    usage error (exit 2) that names each tenant's default; naming the agent works."""
    path = tmp_path / "c.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        "tenants: [{id: acme, allow_unsandboxed: true}, {id: globex, allow_unsandboxed: true}]\n"
        "agents:\n  defaults: {sandbox: {mode: 'off'}}\n  list:\n"
        f"    - {{id: alpha, tenant: acme, default: true, workspace: {tmp_path / 'alpha'}}}\n"
        f"    - {{id: beta, tenant: globex, default: true, workspace: {tmp_path / 'beta'}}}\n"
    )
    ran = run_cli("--config", str(path), "call", "--session", "t1", "read", '{"path": "x"}')
    assert ran.returncode == 2 and "alpha (tenant acme), beta (tenant globex)" in ran.stderr, ran.stderr
    named = run_cli("--config", str(path), "call", "--agent", "beta", "--session", "t1", "read", '{"path": "x"}')
    assert "FILE_NOT_FOUND" in named.stdout + named.stderr, named.stdout + named.stderr
