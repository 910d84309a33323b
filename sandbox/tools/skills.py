"""SKILL.md tools: a folder with YAML front matter (the spec) and handler.py (run in the sandbox).

A skill is refused at load time, with the reason, when its front matter is invalid or it asks
for permissions the global policy (`skills.allowed`) does not grant; the other skills still load.
Handlers never run in the orchestrator process, and never through a shell (a folder name is
data, not code): in a sandboxed session each call gets a container of its own that mounts only
the paths the skill declares (see :mod:`sandbox.runtime.skill_spec`); in mode `off` a host
process with a minimal environment. A skill may not take the name of a built-in tool or alias
(a policy naming it would mean the built-in).
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from sandbox.config.models import SkillPermissions, SkillsConfig
from sandbox.config.skill_files import RESERVED_NAMES, front_matter
from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.spec import RetryPolicy, ToolArgs, ToolSpec

_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


class SkillParameter(BaseModel):
    """One parameter in SKILL.md."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["string", "integer", "number", "boolean", "array", "object"]
    description: str = ""
    required: bool = False
    default: Any = None
    enum: list[Any] | None = None


class SkillManifest(BaseModel):
    """The front matter of SKILL.md."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}(\.[a-z][a-z0-9_]{0,63})?$")
    description: str = Field(min_length=1)
    parameters: dict[str, SkillParameter] = {}
    permissions: SkillPermissions = SkillPermissions()
    timeout: float = Field(30.0, gt=0, le=3600)
    max_concurrency: int | None = Field(None, ge=1)
    requires_approval: bool = False
    version: str = "1"


@dataclass(frozen=True)
class Skill:
    """A loaded skill."""

    manifest: SkillManifest
    folder: Path
    mount_index: int  # which skills dir it came from


@dataclass(frozen=True)
class SkillProblem:
    """Why one skill was refused."""

    file: Path
    message: str


def _glob_within(pattern: str, allowed: list[str]) -> bool:
    """Whether every path `pattern` can match is also matched by one of `allowed`."""
    if ".." in pattern.split("/"):
        return False
    fixed = pattern.split("*", 1)[0]  # the part before the first wildcard
    for grant in allowed:
        if pattern == grant or ("*" not in pattern and fnmatch.fnmatchcase(pattern, grant)):
            return True
        base = grant.removesuffix("**")
        if grant.endswith("/**") and (fixed.startswith(base) or fixed == base.rstrip("/")):
            return True
    return False


def permission_problems(declared: SkillPermissions, allowed: SkillPermissions) -> list[str]:
    """Each declared permission the policy does not grant, as a sentence."""
    out = []
    for kind in ("read", "write"):
        granted = getattr(allowed.filesystem, kind)
        for pattern in getattr(declared.filesystem, kind):
            if not _glob_within(pattern, granted):
                out.append(
                    f"permissions.filesystem.{kind} {pattern!r} is not within skills.allowed.filesystem.{kind} "
                    f"({', '.join(granted) or 'nothing'})"
                )
    for domain in declared.network:
        if not any(fnmatch.fnmatchcase(domain, a) for a in allowed.network):
            out.append(
                f"permissions.network {domain!r} is not in skills.allowed.network "
                f"({', '.join(allowed.network) or 'no network'})"
            )
    return out


def load_skills(config: SkillsConfig) -> tuple[list[Skill], list[SkillProblem]]:
    """Scan every skills dir for */SKILL.md; return the skills that load and why others did not."""
    skills: list[Skill] = []
    problems: list[SkillProblem] = []
    seen: dict[str, Path] = {}
    for index, root in enumerate(config.dirs):
        for file in sorted(Path(root).glob("*/SKILL.md")):
            try:
                manifest = SkillManifest.model_validate(front_matter(file.read_text(encoding="utf-8"), file))
            except ValidationError as exc:
                for err in exc.errors():
                    key = ".".join(str(p) for p in err["loc"]) or "(front matter)"
                    problems.append(SkillProblem(file, f"{key}: {str(err['msg']).lower()}"))
                continue
            except (ValueError, OSError) as exc:
                problems.append(SkillProblem(file, str(exc)))
                continue
            if not (file.parent / "handler.py").is_file():
                problems.append(SkillProblem(file, "handler.py is missing next to SKILL.md"))
                continue
            if manifest.name in RESERVED_NAMES:
                problems.append(SkillProblem(file, reserved_name_problem(manifest.name)))
                continue
            refused = permission_problems(manifest.permissions, config.allowed)
            if refused:
                problems.extend(SkillProblem(file, f"refused: {r}") for r in refused)
                continue
            if manifest.name in seen:
                problems.append(SkillProblem(file, f"name {manifest.name!r} is already taken by {seen[manifest.name]}"))
                continue
            seen[manifest.name] = file
            skills.append(Skill(manifest, file.parent, index))
    return skills, problems


def reserved_name_problem(name: str) -> str:
    """Why a skill may not be called `name` (a built-in tool name or alias)."""
    target = RESERVED_NAMES[name]
    what = "the built-in tool" if target == name else f"an alias of the built-in tool {target!r}"
    return (
        f"refused: name {name!r} is {what}; a policy naming {name!r} would mean the built-in, "
        "so a skill may not take a tool name or alias (rename it)"
    )


def skill_spec(skill: Skill) -> ToolSpec:
    """The ToolSpec of a skill, its arguments model built from the declared parameters."""
    m = skill.manifest
    fields: dict[str, Any] = {}
    for pname, param in m.parameters.items():
        annotation: Any = _TYPES[param.type]
        if param.enum:
            annotation = Literal[tuple(param.enum)]
        if not param.required:
            annotation = annotation | None
        default = ... if param.required else param.default
        fields[pname] = (annotation, Field(default, description=param.description or None))
    params: type[ToolArgs] = create_model(f"skill_{m.name.replace('.', '_')}_args", __base__=ToolArgs, **fields)
    return ToolSpec(
        name=m.name,
        description=m.description,
        parameters=params,
        category="skill",
        risk="medium",
        timeout_s=m.timeout,
        sandboxed=True,
        max_concurrency=m.max_concurrency,
        retry=RetryPolicy(idempotent=False),
        permissions={
            "filesystem.read": tuple(m.permissions.filesystem.read),
            "filesystem.write": tuple(m.permissions.filesystem.write),
            "network": tuple(m.permissions.network),
        },
        version=m.version,
        requires_approval=m.requires_approval,
    )


def skill_handler(skill: Skill) -> Any:
    """A handler that runs handler.py with the arguments as JSON in $SKILL_ARGS (argv, no shell)."""
    from sandbox.runtime import skill_spec  # the runtime: only for a handler, not for a policy's skill names

    m = skill.manifest

    async def handler(ctx: Any, args: ToolArgs) -> Any:
        env = {"SKILL_ARGS": json.dumps(args.model_dump(mode="json")), "SKILL_NAME": m.name}
        if ctx.sandboxed:
            runner = ctx.shell.one_shot()  # the skill's sandbox goes on the session's engine
            if runner is None:
                raise SandboxError(
                    ErrorCode.SANDBOX_UNAVAILABLE, "this session's backend cannot make a sandbox for a skill call"
                )
            fs = m.permissions.filesystem
            call = skill_spec.SkillCall(
                m.name, skill.folder, tuple(fs.read), tuple(fs.write), bool(m.permissions.network), ctx.call_id
            )
            argv = ["python3", f"{skill_spec.SKILL_HOME}/handler.py"]
            result = await runner.run(ctx.shell.spec, call, argv, {"LANG": "C.UTF-8", **env}, m.timeout)
        else:
            python = shutil.which("python3", path=skill_spec.HOST_PATH) or "python3"
            argv = [python, str(skill.folder / "handler.py")]
            env = skill_spec.minimal_env(ctx.workdir, env)
            result = await skill_spec.run_on_host(argv, env, ctx.workdir, m.timeout)
        return _outcome(m.name, m.timeout, result)

    return handler


def _outcome(name: str, timeout: float, result: Any) -> Any:
    out = result.stdout.decode("utf-8", errors="replace")
    if result.timed_out:
        raise SandboxError(ErrorCode.TIMEOUT, f"skill {name} timed out after {timeout:g}s")
    if result.exit_code != 0:
        err = result.stderr.decode("utf-8", errors="replace")[-800:]
        raise SandboxError(ErrorCode.INTERNAL, f"skill {name} failed (exit {result.exit_code}): {err.strip()}")
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        return out
