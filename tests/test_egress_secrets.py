"""Reading egress secrets where the orchestrator runs: env and file sources, a missing value stops
the sandbox with a message naming it, placeholders are fresh and carry nothing of the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.errors import SandboxUnavailable
from sandbox.runtime import egress_secrets


def _policy(value_from: str) -> dict[str, object]:
    secret = {"name": "API_TOKEN", "value_from": value_from, "hosts": ["api.example.com"], "header": "Authorization"}
    return {"secrets": [{**secret, "format": "Bearer {}"}]}


def test_values_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBX_T_TOKEN", "tok-123")
    (tmp_path / "token").write_text("file-456\n")
    one = egress_secrets.resolve(_policy("env:SBX_T_TOKEN"), "sbx-x")[0]
    two = egress_secrets.resolve(_policy(f"file:{tmp_path / 'token'}"), "sbx-x")[0]
    assert one["value"] == "tok-123" and two["value"] == "file-456"
    assert one["placeholder"] != two["placeholder"]  # fresh for every proxy made
    for item in (one, two):
        assert item["placeholder"].startswith("sbx-secret-api-token-") and item["value"] not in item["placeholder"]


@pytest.mark.parametrize("source", ["env:SBX_T_UNSET_VARIABLE", "file:/nonexistent/token"])
def test_a_missing_value_names_the_secret(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SBX_T_UNSET_VARIABLE", raising=False)
    with pytest.raises(SandboxUnavailable) as caught:
        egress_secrets.resolve(_policy(source), "sbx-x")
    assert "egress secret API_TOKEN" in caught.value.message


def test_the_sandbox_environment_holds_placeholders_and_the_bundle_only() -> None:
    env = egress_secrets.sandbox_environment({"API_TOKEN": "sbx-secret-api-token-abc"})
    assert env["API_TOKEN"] == "sbx-secret-api-token-abc"
    assert env["CURL_CA_BUNDLE"] == env["SSL_CERT_FILE"] == egress_secrets.CA_BUNDLE
    assert egress_secrets.sandbox_environment({}) == {}  # no secrets: no CA, nothing decrypted


def test_upstream_ca_must_be_a_certificate(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(SandboxUnavailable):
        egress_secrets.upstream_ca_pem({"upstream_ca": str(bad)}, "sbx-x")
    assert egress_secrets.upstream_ca_pem({"upstream_ca": None}, "sbx-x") == ""


def test_secret_hosts_are_exact_names(tmp_path: Path) -> None:
    """A wildcard would decrypt (and hand the secret to) every host it matches: refused at load."""
    from sandbox.config import load_config_text
    from sandbox.errors import ConfigError

    for hosts in (["*"], ["*.example.com"]):
        text = (
            f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{egress: {{secrets: "
            f"{{API_TOKEN: {{value_from: 'env:X', hosts: {hosts}}}}}}}}}}}}}\n"
        )
        with pytest.raises(ConfigError) as caught:
            load_config_text(text, source="t.yaml")
        assert "secrets.API_TOKEN.hosts[0]" in str(caught.value), str(caught.value)
