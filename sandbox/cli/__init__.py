"""The `sandbox` command: thin over the library (parse, call, print)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from sandbox import __version__
from sandbox.errors import ConfigError, SandboxError, UsageError
from sandbox.escape import escape, escape_json

if TYPE_CHECKING:  # the commands import what they use when they run: `--help` stays cheap
    from sandbox.config import Config
    from sandbox.policy import Identity, PolicyResolver
    from sandbox.sessions.registry import Child
    from sandbox.tools.registry import ToolRegistry

F = TypeVar("F", bound=Callable[..., Any])


class State:
    """What the top-level options set up for every command."""

    def __init__(self, config_path: str | None) -> None:
        self.config_path = config_path
        self._config: Config | None = None
        self._registry: ToolRegistry | None = None

    def registry(self) -> ToolRegistry:
        """Built-in tools plus the config's skills; refused skills are reported on stderr once."""
        if self._registry is None:
            # here, not at the top: `sandbox --help` stays cheap
            from sandbox.tools.catalog import build_registry

            self._registry, problems = build_registry(self.config)
            for problem in problems:
                click.echo(f"warning: skill {problem.file}: {problem.message}", err=True)
        return self._registry

    def lineage(self, session: str) -> Child | None:
        """The lineage of a spawned session (None for any other, or when nothing was spawned)."""
        # here, not at the top: `sandbox --help` stays cheap
        from sandbox.sessions.child import lineage_of

        return lineage_of(self.config.state_dir, session)

    def resolver(self) -> PolicyResolver:
        """A policy resolver over the config and every registered tool."""
        # here, not at the top: `sandbox --help` stays cheap
        from sandbox.policy import PolicyResolver
        from sandbox.tools import BUILTIN_BY_NAME
        from sandbox.tools.catalog import skill_tool_names

        if self._registry is not None:
            extra = tuple(n for n in self._registry.names() if n not in BUILTIN_BY_NAME)
        else:  # the names are enough: no tool handler is loaded to explain a policy
            extra = skill_tool_names(self.config)
        return PolicyResolver(self.config, extra_tools=extra)

    @property
    def config(self) -> Config:
        """The loaded config (loaded once, on first use)."""
        if self._config is None:
            # here, not at the top: `sandbox --help` stays cheap
            from sandbox.config import load_config, load_config_text

            if self.config_path:
                self._config = load_config(self.config_path)
            else:
                self._config = load_config_text("{}", source="<defaults>", base_dir=Path.cwd())
        return self._config


def _emit(data: Any, as_json: bool, text: str) -> None:
    # text carries names and values a model or a sandbox chose: never let them act on the terminal
    click.echo(escape_json(data, indent=2) if as_json else escape(text, multiline=True))


def handled(fn: F) -> F:
    """Map library errors to messages on stderr and the exit code table (no tracebacks)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        # both are SandboxErrors: caught before their root, for their own wording
        except ConfigError as exc:
            click.echo("config error:", err=True)
            for problem in exc.problems:
                click.echo(f"  {escape(problem)}", err=True)
            sys.exit(exc.exit_code)
        except UsageError as exc:
            click.echo(f"error: {escape(exc.message)}", err=True)
            sys.exit(exc.exit_code)
        except SandboxError as exc:
            click.echo(f"error [{exc.code}]: {escape(exc.message)}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def _not_provided(state: State, allowed: frozenset[str] | set[str]) -> list[str]:
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.tools.catalog import skill_tool_names
    from sandbox.tools.handlers import PROVIDED_BUILTINS

    provided = PROVIDED_BUILTINS | set(skill_tool_names(state.config))
    return sorted(t for t in allowed if t not in provided)


def _identity(state: State, agent: str | None, session: str, provider: str | None, model: str | None) -> Identity:
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.config.merge import default_agent_id
    from sandbox.policy import Identity
    from sandbox.policy.sessions import agent_of

    agent_id = agent or agent_of(session) or default_agent_id(state.config)
    child = state.lineage(session)
    narrow = child.tools if child is not None else None
    return Identity(agent=agent_id, session=session, provider=provider, model=model, narrow=narrow)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="sandbox", message="%(prog)s %(version)s")
@click.option(
    "--config",
    "config_path",
    envvar="SANDBOX_CONFIG",
    type=click.Path(dir_okay=False),
    help="Config file (YAML or JSON). Default: $SANDBOX_CONFIG, else built-in defaults.",
)
@click.option("--log-level", default="WARNING", show_default=True, help="Log level on stderr.")
@click.option("--log-json", is_flag=True, help="Log JSON lines on stderr.")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, log_level: str, log_json: bool) -> None:
    """Decide which tools an AI agent may call, and run them in hardened Docker sandboxes."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox import _edge

    _edge.want_logging(log_level, serialize=log_json)  # applied when the library first logs
    ctx.obj = State(config_path)


@main.command()
@click.option("--agent", help="Agent id (default: from the session key, else the default agent).")
@click.option("--session", required=True, help="Session key, e.g. agent:main:main.")
@click.option("--provider", help="Model provider, e.g. openai.")
@click.option("--model", help="Model id, e.g. gpt-4o.")
@json_option
@click.pass_obj
@handled
def explain(
    state: State,
    agent: str | None,
    session: str,
    provider: str | None,
    model: str | None,
    as_json: bool,
) -> None:
    """Why each tool exists or not for a session, and whether it is sandboxed."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.policy import explain_data, explain_text
    from sandbox.tools.availability import unavailable

    policy = state.resolver().resolve(_identity(state, agent, session, provider, model))
    data = explain_data(policy)
    text = explain_text(policy)
    missing = _not_provided(state, policy.allowed)
    if missing:
        data["not_provided"] = missing
        text += (
            "\n\nallowed by policy, not provided by this build (the model is not offered them): "
            + ", ".join(missing)
            + "\n  to provide one: register a handler (ToolRegistry.register) or add a SKILL.md tool (skills.dirs)"
        )
    cannot = {t: why for t in sorted(policy.allowed) if t not in missing and (why := unavailable(t, policy))}
    if cannot:
        data["not_runnable_here"] = cannot
        text += "\n\nallowed by policy, cannot run in this session (the model is not offered them):"
        text += "".join(f"\n  {t}: {why}" for t, why in cannot.items())
    if policy.sandbox.sandboxed:
        # here, not at the top: `sandbox --help` stays cheap
        from sandbox.sessions.child import child_agent

        child = state.lineage(session)
        agent_view = child_agent(state.config, policy.agent, child) if child is not None else None
        if state.config.runtime.backend == "kubernetes":
            # each engine's facts only where that engine runs the sandboxes
            from sandbox.runtime.kubernetes.explain import pod_facts, pod_text

            data["pod"] = pod_facts(state.config, policy, agent=agent_view)
            text += "\n\n" + pod_text(data["pod"])
        else:
            # each engine's facts only where that engine runs the sandboxes
            from sandbox.runtime.docker.explain import container_facts, container_text

            data["container"] = container_facts(state.config, policy, agent=agent_view)
            text += "\n\n" + container_text(data["container"])
    _emit(data, as_json, text)


@main.command("tools")
@click.option("--agent")
@click.option("--session", required=True)
@click.option("--provider")
@click.option("--model")
@click.option("--format", "fmt", type=click.Choice(["openai", "anthropic", "mcp"]), default="openai")
@json_option
@click.pass_obj
@handled
def tools_cmd(
    state: State,
    agent: str | None,
    session: str,
    provider: str | None,
    model: str | None,
    fmt: str,
    as_json: bool,
) -> None:
    """The tool definitions the model would receive, in a vendor's shape."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.tools import render
    from sandbox.tools.availability import offered

    registry = state.registry()
    policy = state.resolver().resolve(_identity(state, agent, session, provider, model))
    here = offered(registry, policy)  # allowed, provided, runnable here: never a tool that cannot run
    specs = [registry.get(d.tool) for d in policy.decisions if d.tool in here]
    data = render(specs, fmt)  # type: ignore[arg-type]
    _emit(data, True, "")  # definitions are JSON either way; --json is accepted for symmetry
    del as_json


@main.group("config")
def config_group() -> None:
    """Validate and show the configuration."""


@config_group.command("check")
@json_option
@click.pass_obj
@handled
def config_check(state: State, as_json: bool) -> None:
    """Validate the config and print the effective merged config."""
    # here, not at the top: `sandbox --help` stays cheap
    import yaml

    from sandbox.config.merge import agent_ids, effective_agent

    config = state.config
    agents = {}
    for agent_id in agent_ids(config):
        eff = effective_agent(config, agent_id)
        agents[agent_id] = {
            "tenant": eff.tenant,
            "workspace": str(eff.workspace),
            "tools": eff.tools.model_dump(mode="json", exclude_none=True),
            "sandbox": eff.sandbox.model_dump(mode="json"),
        }
    data = {
        "source": state.config_path or "<defaults>",
        "config": config.model_dump(mode="json"),
        "agents": agents,
    }
    if as_json:
        _emit(data, True, "")
        return
    click.echo(f"ok: {data['source']} is valid ({len(agents)} agent(s))")
    click.echo(yaml.safe_dump({"effective_agents": agents}, sort_keys=False))


def run() -> None:
    """Entry point used by `python -m sandbox`."""
    main(prog_name=os.path.basename(sys.argv[0]) if sys.argv else "sandbox")


# Command modules register themselves on `main` (imported last: they import it).
from sandbox.cli import (  # noqa: E402, F401
    control_cmds,
    journal_cmds,
    k8s_cmds,
    runtime_cmds,
    service_cmds,
    session_cmds,
    state_cmds,
    tool_cmds,
)
