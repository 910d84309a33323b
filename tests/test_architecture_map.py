"""docs/architecture.md names every package folder, one line each, and no folder that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _documented() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Folders and directions", 1)[1]
    block = section.split("```", 2)[1]  # the first fenced block of the section
    return [m.group(1) for m in re.finditer(r"^(sandbox/\S*)\s", block, re.M)]


def test_the_folder_list_matches_the_package() -> None:
    """Every folder of the package (sandbox/ and each subpackage) has exactly one line, and each line a folder."""
    folders = sorted(f"{p.parent.relative_to(ROOT).as_posix()}/" for p in (ROOT / "sandbox").rglob("__init__.py"))
    documented = _documented()
    assert len(documented) == len(set(documented)), "a folder is listed twice"
    assert sorted(documented) == folders


def test_the_runtime_is_split_by_engine() -> None:
    """The runtime's backend folders are in the map (a new engine is a new folder beside them)."""
    assert {"sandbox/runtime/docker/", "sandbox/runtime/host/", "sandbox/runtime/agent/"} <= set(_documented())
