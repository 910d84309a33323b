"""scripts/structure-report prints every section of its report for the working tree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = (
    "## 1. Files and lines per folder",
    "## 2. The 15 longest functions",
    "## 3. Duck-typed sites",
    "## 4. Function-local imports",
    "## 5. Import cycles",
    "## 6. Import contracts",
)


@pytest.mark.slow
def test_the_report_has_every_section() -> None:
    """The report of the working tree has its six sections in order, a countable duck-typed total and the contracts."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "structure-report")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("# Structure of sandbox/ at the working tree")
    positions = [out.find(section) for section in SECTIONS]
    assert -1 not in positions and positions == sorted(positions), positions
    count = re.search(r"^Duck-typed sites: (\d+)$", out, re.M)
    assert count is not None, out
    listed = out.split("## 3.", 1)[1].split("## 4.", 1)[0].count("\n- ")
    assert listed == int(count.group(1))  # one line per counted site
    assert re.search(r"^Contracts: (none|\d+ kept, \d+ broken)", out, re.M), out
