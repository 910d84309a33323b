"""What a fresh `sandbox` process loads to start: heavy modules wait for the command that needs them.

Timing lives in bench/cli.py; these tests hold the imports that timing depends on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import ROOT

# what a start must not pay for: the docker SDK (and requests under it), the journal's sqlite3
HEAVY = ("docker", "requests", "urllib3", "sqlite3", "sandbox.journal.store")

PROBE = """
import json, sys
from sandbox.cli import main
try:
    main(sys.argv[1:], prog_name="sandbox")
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "heavy": sorted(m for m in %r if m in sys.modules)}), file=sys.stderr)
"""


def _loaded_by(*argv: str, heavy: tuple[str, ...] = HEAVY) -> dict[str, object]:
    """Run the CLI in a fresh interpreter; return its exit code and the heavy modules it loaded."""
    run = subprocess.run(
        [sys.executable, "-c", PROBE % (heavy,), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    result: dict[str, object] = json.loads(run.stderr.strip().splitlines()[-1])
    return result


def test_help_loads_nothing_heavy() -> None:
    """`sandbox --help` starts without the docker SDK, the journal, the config models or the web stack."""
    heavy = (*HEAVY, "sandbox.config.models", "pydantic", "fastapi", "uvicorn", "mcp")
    assert _loaded_by("--help", heavy=heavy) == {"code": 0, "heavy": []}


@pytest.mark.slow
def test_explain_of_a_sandboxed_session_loads_nothing_heavy(tmp_path: Path) -> None:
    """`sandbox explain` of a sandboxed session shows the container without importing the docker SDK."""
    (tmp_path / "ws").mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(
        f"state_dir: {tmp_path}/state\n"
        f"agents: {{defaults: {{workspace: {tmp_path}/ws, sandbox: {{mode: all, workspace_access: rw}}}}}}\n"
    )
    assert _loaded_by("--config", str(config), "explain", "--session", "agent:main:x", "--json") == {
        "code": 0,
        "heavy": [],
    }
