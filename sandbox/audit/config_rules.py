"""Rules over the config: every agent's effective sandbox (as the container it would make),
its tool policy, and the escape hatches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sandbox.audit.config_docs import inspect_of
from sandbox.audit.container_rules import audit_container
from sandbox.audit.egress_rules import egress_findings
from sandbox.audit.findings import Finding
from sandbox.audit.isolation_rules import (
    browser_network_findings,
    preview_findings,
    sender_findings,
    shared_bind_findings,
    shared_findings,
    workspace_findings,
)
from sandbox.audit.policy_rules import host_session_findings
from sandbox.config.merge import agent_ids, effective_agent
from sandbox.config.models import Config
from sandbox.errors import SandboxError
from sandbox.policy.resolver import Identity, PolicyResolver

HOST_SIDE_DANGEROUS = ("gateway", "cron", "nodes", "message", "canvas")


def audit_config(
    config: Config, scratch_roots: Sequence[str] = (), senders: Mapping[str, set[str]] | None = None
) -> list[Finding]:
    """Every config rule for every agent; `senders` (agent -> senders seen) feeds SBX-S002."""
    findings: list[Finding] = workspace_findings(config) + shared_findings(config) + host_session_findings(config)
    findings += sender_findings(config, senders or {}) + preview_findings(config)
    tenants_by_source: dict[str, set[str]] = {}
    resolver = PolicyResolver(config)
    for agent_id in agent_ids(config):
        agent = effective_agent(config, agent_id)
        target = f"agent {agent_id} (config)"
        sandbox = agent.sandbox
        docker = sandbox.docker
        for flag in (
            "dangerously_allow_system_paths",
            "dangerously_allow_credential_paths",
            "dangerously_allow_sockets",
        ):
            if getattr(docker, flag):
                findings.append(
                    Finding(
                        "SBX-P001",
                        "high",
                        "escape hatch enabled",
                        f"{agent.key_path}.sandbox.docker.{flag}",
                        f"remove {flag}",
                        target,
                    )
                )
        if sandbox.mode == "off":
            runtime_tools = sorted(
                t
                for t in resolver.resolve(Identity(agent_id, f"agent:{agent_id}:audit")).allowed
                if t in ("exec", "process", "write", "edit", "apply_patch")
            )
            if runtime_tools:
                findings.append(
                    Finding(
                        "SBX-P002",
                        "high",
                        "runtime or fs tools on the host",
                        f"sandbox.mode off and the policy allows {runtime_tools}: every session runs them on the host",
                        "set sandbox.mode non-main or all, or deny group:runtime and group:fs",
                        target,
                    )
                )
            continue
        session = f"agent:{agent_id}:audit-non-main"
        policy = resolver.resolve(Identity(agent_id, session))
        host_side = sorted(t for t in policy.allowed if t in HOST_SIDE_DANGEROUS)
        if host_side:
            findings.append(
                Finding(
                    "SBX-P003",
                    "high",
                    "sandboxed session can call host-side tools",
                    f"{session} may call {host_side}, which act outside its sandbox",
                    "deny them in tools.sandbox.tools.deny",
                    target,
                )
            )
        findings += egress_findings(agent, target)
        if policy.sandbox.sandboxed:
            findings += browser_network_findings(
                [docker.network], sandbox.browser.network, f"{agent.key_path}.sandbox.docker.network is", target
            )
        try:
            doc = inspect_of(config, agent_id, session)
        except SandboxError as exc:
            findings.append(
                Finding(
                    "SBX-M005",
                    "critical",
                    "configured bind refused",
                    exc.message,
                    str(exc.details.get("fix", "")),
                    target,
                )
            )
            continue
        findings += audit_container(doc, target, scratch_roots)
        for mount in doc["Mounts"]:
            tenants_by_source.setdefault(str(mount["Source"]), set()).add(agent.tenant)
    return findings + shared_bind_findings(tenants_by_source, "config", scratch_roots)
