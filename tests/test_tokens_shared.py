"""Stored tenant tokens: `sandbox tenants token create|list|revoke` on the state dir's file, and
with a PostgreSQL `state.url` on the shared store, where a token made or revoked through any host
is taken or refused by every replica at once (NOTIFY; api/shared_tokens.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sandbox.api.shared_tokens import RELOAD_S
from sandbox.config.state import parse_state_url
from sandbox.state.admin import migrate_store
from tests.cli_helpers import run_cli
from tests.service_helpers import serve


def _config_text(state: Path, ws: Path, url: str | None = None) -> str:
    store = f"state: {{url: '{url}'}}\n" if url else ""
    return f"""
state_dir: {state}
{store}tenants: [{{id: acme, allow_unsandboxed: true}}, {{id: globex, allow_unsandboxed: true}}]
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list: [{{id: a, tenant: acme, workspace: "{ws / "wa"}"}}, {{id: b, tenant: globex, workspace: "{ws / "wb"}"}}]
"""


def _cli(cfg: Path, *args: str) -> Any:
    return run_cli("--config", str(cfg), "tenants", "token", *args)


def test_a_stored_token_is_listed_by_name_and_revoked_from_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(_config_text(tmp_path / "state", tmp_path / "ws"))
    made = _cli(cfg, "create", "acme", "--name", "laptop", "--json")
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    listed = _cli(cfg, "list", "--json")
    assert [(t["tenant"], t["name"]) for t in json.loads(listed.stdout)] == [("acme", "laptop")]
    assert token not in listed.stdout  # a hash, never the token
    from sandbox import load_config
    from sandbox.api.tenants import Tenants

    tenants = Tenants(load_config(cfg))
    assert tenants.authenticate(token) is not None
    assert _cli(cfg, "revoke", "acme", "--name", "laptop").returncode == 0
    assert tenants.authenticate(token) is None  # a running service reads the file again
    again = _cli(cfg, "revoke", "acme", "--name", "laptop")
    assert again.returncode == 2 and "no stored token named 'laptop'" in again.stderr
    assert _cli(cfg, "revoke", "nobody").returncode == 2


def _accepted(url: str, token: str) -> bool:
    return httpx.get(f"{url}/v1/agents", headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code == 200


def _until(what: Any, seconds: float) -> float:
    started = time.monotonic()
    while not what():
        assert time.monotonic() - started < seconds, "timed out"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.postgres
@pytest.mark.slow
def test_a_token_made_or_revoked_through_one_host_is_taken_or_refused_by_every_replica(
    tmp_path: Path, pg_url: str
) -> None:
    from sandbox.config import load_config_text

    anyio.run(migrate_store, parse_state_url(pg_url), tmp_path)
    configs = []
    for name in ("a", "b", "cli"):
        (tmp_path / name).mkdir()
        text = _config_text(tmp_path / name / "state", tmp_path / "ws", pg_url)
        (tmp_path / name / "c.yaml").write_text(text)
        configs.append(load_config_text(text))
    cli = tmp_path / "cli" / "c.yaml"  # a third host: the operator's, with its own state dir
    with serve(configs[0]) as one, serve(configs[1]) as two:
        made = _cli(cli, "create", "acme", "--name", "ci", "--json")
        assert made.returncode == 0, made.stderr
        token = json.loads(made.stdout)["token"]
        assert "shared store" in _cli(cli, "create", "globex", "--name", "ci").stdout
        for url in (one, two):
            _until(lambda u=url: _accepted(u, token), 5)  # NOTIFY: long before the 30 s reload
        agents = httpx.get(f"{one}/v1/agents", headers={"Authorization": f"Bearer {token}"}).json()
        assert [a["id"] for a in agents] == ["a"]  # the token is acme's, not globex's
        assert not (tmp_path / "a" / "state" / "tenant-tokens.json").exists()  # in the store, not a file
        dup = _cli(cli, "create", "acme", "--name", "ci")
        assert dup.returncode == 2 and "already has a token named 'ci'" in dup.stderr
        assert [(t["tenant"], t["name"]) for t in json.loads(_cli(cli, "list", "--json").stdout)] == [
            ("acme", "ci"),
            ("globex", "ci"),
        ]
        assert _cli(cli, "revoke", "acme", "--name", "ci").returncode == 0
        waited = max(_until(lambda u=url: not _accepted(u, token), 5) for url in (one, two))
        assert waited < RELOAD_S
        assert _accepted(one, token) is False and _accepted(two, token) is False
        # a token in a host's own file still counts there: listed as such, and revoked there too
        from sandbox.api.token_file import write_tokens

        write_tokens(tmp_path / "cli" / "state", [{"tenant": "acme", "name": "old", "sha256": "ab" * 32}])
        listed = json.loads(_cli(cli, "list", "--json").stdout)
        assert {(t["tenant"], t["name"], t["where"]) for t in listed} == {
            ("globex", "ci", "store"),
            ("acme", "old", "file"),
        }
        assert _cli(cli, "revoke", "acme", "--name", "old").returncode == 0
        assert [t["name"] for t in json.loads(_cli(cli, "list", "--json").stdout)] == ["ci"]
