"""Running the `sandbox` CLI in a subprocess, the way a user does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, config: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m sandbox [--config FILE] ARGS...` from the repo root; output captured as text."""
    prefix = ["--config", str(config)] if config is not None else []
    return subprocess.run(
        [sys.executable, "-m", "sandbox", *prefix, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
