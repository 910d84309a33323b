"""Config rules about who runs tools on the host: the main session of `mode: non-main`, the
host backend, and the built-in defaults that apply when no config file is given."""

from __future__ import annotations

from sandbox.audit.findings import Finding
from sandbox.config.merge import agent_ids, effective_agent
from sandbox.config.models import Config
from sandbox.policy.resolver import Identity, PolicyResolver

HOST_TOOLS = ("exec", "process", "read", "write", "edit", "apply_patch")


def is_builtin_defaults(config: Config) -> bool:
    """Whether the config says nothing beyond the built-in defaults (where it keeps state aside)."""
    return config.model_dump(exclude={"state_dir", "instance"}) == Config().model_dump(
        exclude={"state_dir", "instance"}
    )


def host_session_findings(config: Config) -> list[Finding]:
    """SBX-P004 (info): a non-main agent's main session runs tools on the host; SBX-P005 (medium):
    no config was given, so the defaults do that for every agent with every tool."""
    resolver = PolicyResolver(config)
    out = []
    for agent_id in agent_ids(config):
        agent = effective_agent(config, agent_id)
        if agent.sandbox.mode != "non-main":
            continue
        session = f"agent:{agent_id}:main"
        allowed = resolver.resolve(Identity(agent_id, session)).allowed
        on_host = sorted(t for t in allowed if t in HOST_TOOLS)
        if on_host:
            out.append(
                Finding(
                    "SBX-P004",
                    "info",
                    "main session runs tools on the host",
                    f"sandbox.mode non-main: {session} is not sandboxed and may call {on_host} on the host as "
                    f"the orchestrator's user, in {agent.workspace}",
                    "set sandbox.mode: all if the main session's input is not fully trusted",
                    f"agent {agent_id} (config)",
                )
            )
    if config.runtime.backend == "host":
        out.append(
            Finding(
                "SBX-P006",
                "critical",
                "no sandbox at all: runtime.backend host",
                "every session's tools, sandboxed or not, run on the orchestrator's host as its user: "
                "nothing isolates one session, tenant or agent from another or from the host",
                "set runtime.backend: docker (the host backend is for testing code built on the library)",
                "config",
            )
        )
    if is_builtin_defaults(config):
        out.append(
            Finding(
                "SBX-P005",
                "medium",
                "built-in defaults in use (no config given)",
                "no tool is denied and the main session runs on the host: "
                f"{len(resolver.resolve(Identity('main', 'agent:main:main')).allowed)} tools, exec included",
                "write a config (start from policies/default.yaml) and pass it with --config or $SANDBOX_CONFIG",
                "config",
            )
        )
    return out
