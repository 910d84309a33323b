"""The audit over `network: egress` configs: each agent's allowlist reported, the wide doors flagged,
and an egress sandbox not mistaken for one on an open network (pure: config only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sandbox.audit.config_rules import audit_config
from sandbox.config import load_config_text
from tests.cli_helpers import run_cli


def _findings(tmp_path: Path, egress: dict[str, Any], tenants: list[dict[str, Any]] | None = None) -> dict[str, str]:
    data: dict[str, Any] = {
        "state_dir": str(tmp_path / "state"),
        "agents": {"defaults": {"sandbox": {"mode": "all", "docker": {"network": "egress"}, "egress": egress}}},
    }
    if tenants is not None:
        data["tenants"] = tenants
    config = load_config_text(yaml.safe_dump(data), source="t.yaml", base_dir=tmp_path)
    return {f.rule: f.evidence for f in audit_config(config)}


def test_the_allowlist_is_reported_and_no_open_network_is_claimed(tmp_path: Path) -> None:
    found = _findings(tmp_path, {"allow": ["pypi.org", "*.pythonhosted.org"]})
    assert "pypi.org" in found["SBX-N001"] and "*.pythonhosted.org" in found["SBX-N001"]
    assert "[80, 443]" in found["SBX-N001"]
    # the sandbox sits on an internal network beside its proxy: not "network egress" (SBX-C028)
    assert "SBX-C028" not in found
    assert not {"SBX-N002", "SBX-N003", "SBX-N004"} & set(found)


def test_a_wildcard_over_everything_is_high_unless_the_tenant_floor_narrows_it(tmp_path: Path) -> None:
    assert "SBX-N002" in _findings(tmp_path, {"allow": ["*"]})
    floored = _findings(tmp_path, {"allow": ["*"]}, tenants=[{"id": "default", "egress": {"allow": ["pypi.org"]}}])
    assert "SBX-N002" not in floored
    assert "floor" in floored["SBX-N001"] and "pypi.org" in floored["SBX-N001"]


def test_a_wildcard_over_a_top_level_domain_and_private_exemptions_are_flagged(tmp_path: Path) -> None:
    found = _findings(tmp_path, {"allow": ["*.com", "*.example.org"], "allow_private": ["10.0.0.0/8"]})
    assert "*.com" in found["SBX-N003"] and "*.example.org" not in found["SBX-N003"]
    assert "10.0.0.0/8" in found["SBX-N004"]


def test_bridge_and_host_networks_stay_flagged(tmp_path: Path) -> None:
    for network, rule in (("bridge", "SBX-C028"), ("host", "SBX-C008")):
        data = {"state_dir": str(tmp_path / "s"), "agents": {"defaults": {"sandbox": {"docker": {"network": network}}}}}
        config = load_config_text(yaml.safe_dump(data), source="t.yaml", base_dir=tmp_path)
        assert rule in {f.rule for f in audit_config(config)}, network


def test_explain_says_what_the_sandbox_reaches(tmp_path: Path) -> None:
    data = {
        "state_dir": str(tmp_path / "state"),
        "agents": {
            "defaults": {"sandbox": {"mode": "all", "docker": {"network": "egress"}, "egress": {"allow": ["pypi.org"]}}}
        },
        "tenants": [{"id": "default", "egress": {"allow": ["pypi.org", "files.example"]}}],
    }
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(data))
    done = run_cli("explain", "--session", "agent:main:x", config=config)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("egress"))
    assert "['pypi.org'] on ports [80, 443]" in line and "tenant floor ['pypi.org', 'files.example']" in line


def test_secrets_hosts_are_reported(tmp_path: Path) -> None:
    found = _findings(
        tmp_path,
        {
            "allow": ["api.example.com"],
            "secrets": {"API_TOKEN": {"value_from": "env:TOKEN", "hosts": ["api.example.com"]}},
        },
    )
    assert "secret API_TOKEN (env:TOKEN) goes to ['api.example.com'] in Authorization" in found["SBX-N001"]


def test_doctor_says_when_the_host_firewall_is_out_of_reach(monkeypatch: Any) -> None:
    """Without iptables (or root) egress sandboxes are refused: doctor warns before a call fails."""
    import shutil

    from sandbox.runtime.docker import doctor

    monkeypatch.setattr(shutil, "which", lambda name: None)
    check = doctor._host_firewall_check()
    assert check.status == "warn" and "egress sandboxes are refused" in check.detail
