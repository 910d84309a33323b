"""`sandbox --version`, `python -m sandbox --version` and `/healthz` name one version: the one pip
installed from pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import sandbox
from sandbox.cli import main

ROOT = Path(__file__).resolve().parents[1]


def pyproject_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_package_version_is_pyprojects() -> None:
    assert sandbox.__version__ == pyproject_version()


def test_sandbox_version_prints_it_and_needs_no_config(tmp_path: Path) -> None:
    """--version answers before anything else: not even a broken config is read."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("agents: [")
    result = CliRunner().invoke(main, ["--config", str(broken), "--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"sandbox {pyproject_version()}\n"


@pytest.mark.slow
def test_python_dash_m_sandbox_version() -> None:
    done = subprocess.run([sys.executable, "-m", "sandbox", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"sandbox {pyproject_version()}\n"
