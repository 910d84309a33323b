"""The policy CLI end to end: output shapes and exit codes (one test runs a real process)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli_helpers import ROOT, run_cli

MULTI = ROOT / "policies" / "examples" / "multi-agent.yaml"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=60)


@pytest.mark.slow
def test_the_installed_entry_point_runs() -> None:
    """`python -m sandbox` as a real process: help, and a config error exits 2 without a traceback."""
    ok = run_cli("--help", process=True)
    assert ok.returncode == 0 and "explain" in ok.stdout
    bad = run_cli("--config", "/nonexistent.yaml", "config", "check", process=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_explain_json_shows_exec_denied_by_agent_layer() -> None:
    """The README's example: family's group session has exec denied by the family agent's deny list."""
    run = cli(
        "--config",
        str(MULTI),
        "explain",
        "--agent",
        "family",
        "--session",
        "agent:family:whatsapp:group:1",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert set(data) >= {"agent", "session", "sandboxed", "sandbox", "tools"}
    assert data["sandboxed"] is True
    assert set(data["sandbox"]) == {"mode", "scope", "workspace_access", "reason"}
    exec_row = next(t for t in data["tools"] if t["name"] == "exec")
    assert exec_row["allowed"] is False
    assert exec_row["layer"] == "agent:family"
    assert exec_row["pattern"] == "group:runtime"
    assert "agents.list[1].tools.deny" in exec_row["fix"]


@pytest.mark.slow
def test_explain_text_lists_every_tool() -> None:
    """The human explain names the sandbox decision and every known tool."""
    run = cli("--config", str(MULTI), "explain", "--session", "agent:main:main")
    assert run.returncode == 0, run.stderr
    assert "sandbox  no: mode non-main" in run.stdout
    assert "of 21 tools exist" in run.stdout


def test_typo_key_exits_2_with_path_line_and_suggestion(tmp_path: Path) -> None:
    """A typo'd key fails with exit 2 naming the key path, line and suggestion, no traceback."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("agents:\n  defaults:\n    sandbox:\n      scop: session\n")
    run = cli("--config", str(cfg), "explain", "--session", "agent:main:x")
    assert run.returncode == 2
    assert f"{cfg}:4:7: agents.defaults.sandbox.scop: unknown key 'scop'; did you mean 'scope'?" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow
def test_unknown_agent_exits_2_naming_known_ids() -> None:
    """An agent id that is not configured exits 2 and names the known ids."""
    run = cli("--config", str(MULTI), "explain", "--agent", "nobody", "--session", "x")
    assert run.returncode == 2
    assert "configured agents: main, family" in run.stderr


def test_tools_formats() -> None:
    """`tools` renders the allowed tools that run in the OpenAI, Anthropic and MCP shapes."""
    for fmt, key in (("openai", "function"), ("anthropic", "input_schema"), ("mcp", "inputSchema")):
        run = cli(
            "--config",
            str(MULTI),
            "tools",
            "--session",
            "agent:family:x",
            "--agent",
            "family",
            "--format",
            fmt,
        )
        assert run.returncode == 0, run.stderr
        tools = json.loads(run.stdout)
        names = {t["function"]["name"] if fmt == "openai" else t["name"] for t in tools}
        # allowed: read, web_fetch, web_search, session_status; offered: only what this build runs
        assert names == {"read", "session_status"}
        assert all(key in t for t in tools)


def test_config_check_prints_effective_config() -> None:
    """`config check --json` validates and prints the merged per-agent config."""
    run = cli("--config", str(MULTI), "config", "check", "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    family = data["agents"]["family"]["sandbox"]
    assert family["mode"] == "all" and family["docker"]["memory"] == "512m"
    assert family["docker"]["cap_drop"] == ["ALL"]
