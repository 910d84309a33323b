"""SKILL.md loading: validation, permission checks, specs, and the CLI listing (pure, fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.config import load_config_text
from sandbox.config.models import SkillsConfig
from sandbox.tools.skills import load_skills, skill_spec

ROOT = Path(__file__).resolve().parent.parent


def write_skill(root: Path, folder: str, front: str, handler: bool = True) -> Path:
    path = root / folder
    path.mkdir(parents=True)
    (path / "SKILL.md").write_text(f"---\n{front}\n---\n\nbody\n")
    if handler:
        (path / "handler.py").write_text("print('{}')\n")
    return path


def test_shipped_skills_load() -> None:
    """The two example skills load with their schemas."""
    skills, problems = load_skills(SkillsConfig(dirs=[ROOT / "skills"]))
    assert problems == []
    specs = {s.manifest.name: skill_spec(s) for s in skills}
    assert set(specs) == {"line_count", "json_query"}
    schema = specs["line_count"].json_schema()
    assert schema["required"] == ["pattern"] and schema["properties"]["top"]["default"] == 5
    assert specs["line_count"].max_concurrency == 2 and specs["line_count"].category == "skill"


def test_bad_skills_refused_with_reasons_and_the_rest_load(tmp_path: Path) -> None:
    """Invalid front matter, a missing handler and forbidden permissions are refused; good ones load."""
    write_skill(
        tmp_path, "good", "name: good\ndescription: fine\npermissions: {filesystem: {read: ['/workspace/src/**']}}"
    )
    write_skill(tmp_path, "greedy", "name: greedy\ndescription: x\npermissions: {filesystem: {write: ['/**']}}")
    write_skill(tmp_path, "net", "name: net\ndescription: x\npermissions: {network: [evil.example.com]}")
    write_skill(tmp_path, "typo", "name: typo\ndescriptoin: x")
    write_skill(tmp_path, "badtype", "name: badtype\ndescription: x\nparameters: {n: {type: float}}")
    write_skill(tmp_path, "nohandler", "name: nohandler\ndescription: x", handler=False)
    write_skill(
        tmp_path, "escape", "name: escape\ndescription: x\npermissions: {filesystem: {read: ['/workspace/../etc/**']}}"
    )
    (tmp_path / "nofront").mkdir()
    (tmp_path / "nofront" / "SKILL.md").write_text("# no front matter\n")
    skills, problems = load_skills(SkillsConfig(dirs=[tmp_path]))
    assert [s.manifest.name for s in skills] == ["good"]
    text = {p.file.parent.name: p.message for p in problems}
    assert text["greedy"] == (
        "refused: permissions.filesystem.write '/**' is not within skills.allowed.filesystem.write (/workspace/**)"
    )
    assert (
        text["net"] == "refused: permissions.network 'evil.example.com' is not in skills.allowed.network (no network)"
    )
    assert text["typo"].startswith("description: field required") or "descriptoin: extra inputs" in " ".join(
        p.message for p in problems if p.file.parent.name == "typo"
    )
    assert "parameters.n.type: input should be" in text["badtype"]
    assert text["nohandler"] == "handler.py is missing next to SKILL.md"
    assert "refused" in text["escape"]
    assert text["nofront"] == "SKILL.md must start with YAML front matter between '---' lines"


def test_policy_can_name_skills(tmp_path: Path) -> None:
    """A config may name a skill in its allow lists (and a typo of it is still an error)."""
    write_skill(tmp_path / "s", "a", "name: my_skill\ndescription: x")
    config = load_config_text(
        f"skills: {{dirs: ['{tmp_path}/s']}}\ntools: {{also_allow: [my_skill], profile: minimal}}"
    )
    assert config.tools.also_allow == ["my_skill"]
    with pytest.raises(Exception, match="unknown tool 'my_skil'; did you mean my_skill"):
        load_config_text(f"skills: {{dirs: ['{tmp_path}/s']}}\ntools: {{also_allow: [my_skil]}}")


def test_tools_cli_lists_skills_next_to_builtins() -> None:
    """`sandbox tools` shows the skill tools beside the built-ins."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandbox",
            "--config",
            "policies/examples/skills.yaml",
            "tools",
            "--session",
            "agent:main:x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    names = [t["function"]["name"] for t in json.loads(run.stdout)]
    assert {"exec", "read", "line_count", "json_query"} <= set(names)
