"""Every tool an orchestrator offers: the built-ins plus the skills its config points at."""

from __future__ import annotations

from sandbox.config.models import Config
from sandbox.tools.builtin import BUILTIN_SPECS
from sandbox.tools.handlers import builtin_handlers
from sandbox.tools.registry import ToolRegistry
from sandbox.tools.skills import SkillProblem, load_skills, skill_handler, skill_spec


def build_registry(config: Config) -> tuple[ToolRegistry, list[SkillProblem]]:
    """A registry with the built-in tools and every skill that loads; and why others did not."""
    handlers = builtin_handlers()
    registry = ToolRegistry((spec, handlers.get(spec.name)) for spec in BUILTIN_SPECS)
    skills, problems = load_skills(config.skills)
    for skill in skills:
        if skill.manifest.name in registry:
            problems.append(SkillProblem(skill.folder / "SKILL.md", f"name {skill.manifest.name!r} is a built-in tool"))
            continue
        registry.register(skill_spec(skill), skill_handler(skill))
    return registry, problems
