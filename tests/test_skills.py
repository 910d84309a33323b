"""SKILL.md loading: validation, permission checks, specs, and the CLI listing (pure, fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.config import Config, load_config_text
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


@pytest.mark.slow
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


def test_skill_named_like_a_tool_or_alias_is_refused(tmp_path: Path) -> None:
    """Skills named `bash` (an alias) or `exec` (a tool) are refused; `allow: [bash]` still means exec, and says so."""
    from sandbox.policy.resolver import Identity, PolicyResolver
    from sandbox.tools.catalog import build_registry

    write_skill(tmp_path / "s", "b", "name: bash\ndescription: shadows the alias")
    write_skill(tmp_path / "s", "e", "name: exec\ndescription: shadows the tool")
    write_skill(tmp_path / "s", "ok", "name: fine\ndescription: x")
    config = load_config_text(
        f"skills: {{dirs: ['{tmp_path}/s']}}\ntools: {{allow: [bash, fine]}}\n"
        "agents: {defaults: {sandbox: {mode: 'off'}}}"
    )
    registry, problems = build_registry(config)
    reasons = {p.file.parent.name: p.message for p in problems}
    assert "is an alias of the built-in tool 'exec'" in reasons["b"] and "rename it" in reasons["b"]
    assert "is the built-in tool" in reasons["e"]
    assert registry.get("exec").category != "skill" and "bash" not in registry
    assert registry.get("fine").category == "skill"
    names = tuple(n for n in registry.names() if registry.get(n).category == "skill")
    allowed = PolicyResolver(config, extra_tools=names).resolve(Identity("main", "agent:main:main")).allowed
    assert allowed == {"exec", "fine"}  # the alias, never a skill behind it


def _host_skill_config(tmp_path: Path, folder: str, handler: str, front: str = "") -> tuple[Config, Path]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    path = write_skill(tmp_path / "skills", folder, f"name: probe\ndescription: x\n{front}")
    (path / "handler.py").write_text(handler)
    config = load_config_text(
        f"state_dir: {tmp_path}/state\nskills: {{dirs: ['{tmp_path}/skills']}}\n"
        "tools: {also_allow: [probe]}\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}"
    )
    return config, ws


@pytest.mark.anyio
async def test_folder_name_with_command_substitution_runs_nothing_on_host(tmp_path: Path) -> None:
    """A skill folder named `x$(touch /tmp/pwned-...)` starts its handler from an argv: nothing is created."""
    import secrets

    from sandbox import Orchestrator

    marker = Path(f"/tmp/pwned-{secrets.token_hex(6)}")
    # a folder name cannot hold '/', so the payload spells it in octal for printf
    folder = "x$(touch $(printf '\\057tmp\\057" + marker.name + "'))"
    config, _ = _host_skill_config(tmp_path, folder, "import json; print(json.dumps({'ran': True}))\n")
    async with Orchestrator(config) as orch:
        result = await orch.session("agent:a:main").call("probe", {})
    assert result.ok, result.error
    assert result.output == {"ran": True}
    assert not marker.exists()


@pytest.mark.anyio
async def test_host_skill_gets_a_minimal_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In mode off a skill sees PATH, LANG, HOME and its own variables, never the orchestrator's secrets."""
    from sandbox import Orchestrator

    monkeypatch.setenv("PROVIDER_API_KEY", "sk-secret-value")
    handler = "import json, os; print(json.dumps(sorted(os.environ)))\n"
    config, _ = _host_skill_config(tmp_path, "probe", handler)
    async with Orchestrator(config) as orch:
        result = await orch.session("agent:a:main").call("probe", {})
    assert result.ok, result.error
    assert set(result.output) <= {"PATH", "LANG", "HOME", "TMPDIR", "SKILL_ARGS", "SKILL_NAME", "LC_CTYPE"}
    assert "PROVIDER_API_KEY" not in result.output


def test_skill_mounts_hold_only_the_declared_paths(tmp_path: Path) -> None:
    """A skill's container mounts its folder and the declared paths: ro unless written, protected paths ro."""
    from sandbox.config import effective_agent
    from sandbox.runtime.skill_spec import SKILL_HOME, fixed_dir, skill_mounts
    from sandbox.runtime.spec import build_spec

    ws = tmp_path / "ws"
    (ws / "public").mkdir(parents=True)
    (ws / "out").mkdir()
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / "secret.txt").write_text("s")
    (ws / "linked").symlink_to("/etc")
    config = load_config_text(
        f"state_dir: {tmp_path}/state\nagents: {{list: [{{id: main, workspace: '{ws}', "
        "sandbox: {workspace_access: rw}}]}"
    )
    session = build_spec(effective_agent(config, "main"), "agent:main:s", "inst", protected_paths=[".git/hooks"])
    folder = write_skill(tmp_path / "skills", "p", "name: p\ndescription: x")
    mounts = skill_mounts(
        session,
        folder,
        ["/workspace/public/**", "/workspace/linked/**", "/workspace/gone/*.txt"],
        ["/workspace/out/**"],
    )
    table = {m.target: (m.source, m.read_only) for m in mounts}
    assert table == {
        SKILL_HOME: (str(folder), True),
        "/workspace/public": (str(ws / "public"), True),
        "/workspace/out": (str(ws / "out"), False),
    }
    everything = skill_mounts(session, folder, ["/workspace/public/**"], ["/workspace/**"])
    pairs = [(m.target, m.read_only) for m in everything]
    assert pairs[:2] == [(SKILL_HOME, True), ("/workspace", False)]
    assert ("/workspace/.git/hooks", True) in pairs  # protected paths stay read-only in a writable grant
    # a grant of a protected path itself, or of a path inside one, is read-only: never more than the session
    (ws / ".git" / "hooks" / "sub").mkdir()
    for declared in ("/workspace/.git/hooks/**", "/workspace/.git/hooks/sub/**"):
        hooks = [(m.target, m.read_only) for m in skill_mounts(session, folder, [], [declared])]
        assert hooks == [(SKILL_HOME, True), (declared.removesuffix("/**"), True)], hooks
    assert all(m.identity is not None for m in mounts[1:])  # what the container checks before the handler
    assert fixed_dir("/workspace/**") == "/workspace" and fixed_dir("/workspace/src/*.py") == "/workspace/src"
    assert fixed_dir("/workspace/a.json") == "/workspace/a.json"
