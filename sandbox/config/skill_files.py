"""What a SKILL.md file declares, read without loading the skill: its front matter and name.

The config loader reads the names so that policies may name skills (config never goes through
tools/ for it); tools/skills.py loads and validates the skills themselves from the same front matter.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from sandbox.policy.groups import ALIASES, BUILTIN_TOOLS

# names a skill may not take: a policy list naming one means the built-in tool
RESERVED_NAMES: dict[str, str] = {**{n: n for n in BUILTIN_TOOLS}, **ALIASES}


def front_matter(text: str, file: Path) -> dict[str, Any]:
    """The YAML mapping between the leading `---` lines of a SKILL.md.

    Raises:
        ValueError: there is none, it is not YAML (with the line and column), or not a mapping.
    """
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not match:
        raise ValueError("SKILL.md must start with YAML front matter between '---' lines")
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f":{mark.line + 2}:{mark.column + 1}" if mark else ""
        raise ValueError(f"YAML error{where}: {exc.problem}") from exc
    if not isinstance(data, dict):
        raise ValueError("the front matter must be a mapping")
    return data


def skill_names(dirs: list[Path]) -> list[str]:
    """Names declared by SKILL.md files (for checking tool names in the config; no validation)."""
    names = []
    for root in dirs:
        for file in sorted(Path(root).glob("*/SKILL.md")):
            try:
                name = front_matter(file.read_text(encoding="utf-8"), file).get("name")
            except (ValueError, OSError):
                continue
            if isinstance(name, str) and name not in RESERVED_NAMES:
                names.append(name)
    return names
