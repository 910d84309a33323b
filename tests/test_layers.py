"""The layers in docs/architecture.md hold: the import contracts in pyproject.toml pass."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = {
    "core-no-backend",
    "runtime-neutral",
    "config-below-runtime",
    "agent-over-any-stream",
    "backends-independent",
    "client-over-http",
}


def test_the_layer_contracts_are_all_there() -> None:
    """No contract was dropped to make the linter pass (each one a rule docs/architecture.md states)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert {c["id"] for c in config["contracts"]} >= CONTRACTS


@pytest.mark.slow
def test_no_import_crosses_a_layer() -> None:
    """`lint-imports` keeps every contract: no new import of docker or a backend folder where it is forbidden."""
    linter = Path(sys.executable).with_name("lint-imports")  # the venv's, beside its python
    done = subprocess.run(
        [str(linter), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout
