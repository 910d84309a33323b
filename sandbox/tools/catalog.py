"""Every tool an orchestrator offers: the built-ins plus the skills its config points at."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.policy.groups import BUILTIN_TOOLS
from sandbox.tools.builtin import BUILTIN_SPECS
from sandbox.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from sandbox.config.models import Config
    from sandbox.tools.skills import SkillProblem


def build_registry(config: Config) -> tuple[ToolRegistry, list[SkillProblem]]:
    """A registry with the built-in tools and every skill that loads; and why others did not."""
    # the handlers' code and the skills' loader: only when tools may run (a policy needs names only)
    from sandbox.tools.handlers import builtin_handlers
    from sandbox.tools.skills import SkillProblem, load_skills, skill_handler, skill_spec

    handlers = builtin_handlers()
    registry = ToolRegistry((spec, handlers.get(spec.name)) for spec in BUILTIN_SPECS)
    skills, problems = load_skills(config.skills)
    for skill in skills:
        if skill.manifest.name in registry:
            problems.append(SkillProblem(skill.folder / "SKILL.md", f"name {skill.manifest.name!r} is a built-in tool"))
            continue
        registry.register(skill_spec(skill), skill_handler(skill))
    return registry, problems


def skill_tool_names(config: Config) -> tuple[str, ...]:
    """The names the config's skills add to the built-in tools (what the policy needs to know).

    Cheaper than :func:`build_registry`: no handler is imported, and without skills nothing is.
    """
    if not config.skills.dirs:
        return ()
    from sandbox.tools.skills import load_skills  # only a config with skills pays for it

    skills, _ = load_skills(config.skills)
    return tuple(s.manifest.name for s in skills if s.manifest.name not in BUILTIN_TOOLS)
