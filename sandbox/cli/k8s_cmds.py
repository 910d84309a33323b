"""`sandbox k8s ...`: what the Kubernetes backend would create, printed as YAML, no cluster needed."""

from __future__ import annotations

from typing import Any

import click

from sandbox.cli import State, handled, main
from sandbox.errors import UsageError


def _yaml(objects: list[dict[str, Any]]) -> str:
    # imported when the command runs: `sandbox --help` stays cheap
    import yaml

    return yaml.safe_dump_all(objects, sort_keys=False, explicit_start=True).rstrip("\n")


@main.group("k8s")
def k8s_group() -> None:
    """Kubernetes: render the objects an operator applies and the Pods sessions would get."""


@k8s_group.command("render")
@click.option("--tenant", "tenants", multiple=True, help="Only this tenant (repeatable); default: every tenant.")
@click.option(
    "--orchestrator",
    default="agent-sandbox/agent-sandbox",
    show_default=True,
    help="NAMESPACE/NAME of the service account the orchestrator runs as (bound in each namespace).",
)
@click.pass_obj
@handled
def render(state: State, tenants: tuple[str, ...], orchestrator: str) -> None:
    """Everything applied once per tenant: namespace (Pod Security labels), service accounts,
    role and binding, quota, limit range, network policies, egress proxies."""
    # imported when the command runs: `sandbox --help` stays cheap
    from sandbox.runtime.kubernetes.tenant import Orchestrator, tenant_objects

    namespace, _, name = orchestrator.partition("/")
    if not namespace or not name:
        raise UsageError(f"--orchestrator wants NAMESPACE/NAME (got {orchestrator!r})")
    config = state.config
    known = {t.id: t for t in config.tenants}
    if not known:
        # imported when the command runs: `sandbox --help` stays cheap
        from sandbox.config.models import TenantConfig

        known = {"default": TenantConfig(id="default")}
    for wanted in tenants:
        if wanted not in known:
            raise UsageError(f"tenant {wanted!r} is not configured (tenants: {', '.join(sorted(known))})")
    chosen = [known[t] for t in tenants] if tenants else list(known.values())
    objects: list[dict[str, Any]] = []
    for tenant in chosen:
        objects += tenant_objects(config, tenant, Orchestrator(namespace, name))
    click.echo(_yaml(objects))


@k8s_group.command("pod")
@click.option("--agent", "agent_id", default=None, help="The agent (default: the config's default agent).")
@click.option("--session", required=True, help="The session key.")
@click.option(
    "--proxy-ip",
    default=None,
    help="The egress proxy Service's ClusterIP (network: egress only; the backend reads it from the cluster).",
)
@click.pass_obj
@handled
def pod(state: State, agent_id: str | None, session: str, proxy_ip: str | None) -> None:
    """The Pod (and workspace claim) the session would get, restricted by construction; under
    `provider: agent-sandbox`, the SandboxTemplate, SandboxWarmPool and SandboxClaim instead."""
    # imported when the command runs: `sandbox --help` stays cheap
    from sandbox.config.merge import default_agent_id, effective_agent
    from sandbox.runtime.kubernetes.names import namespace_for
    from sandbox.runtime.kubernetes.pod import ProxyRef, sandbox_pod, workspace_claim
    from sandbox.runtime.kubernetes.proxy_ca import ca_placeholder
    from sandbox.runtime.naming import instance_id
    from sandbox.runtime.spec import spec_from_config

    config = state.config
    agent_id = agent_id or default_agent_id(config)
    try:
        agent = effective_agent(config, agent_id)
    except KeyError:
        raise UsageError(f"agent {agent_id!r} is not configured") from None
    spec = spec_from_config(config, agent, session, instance_id(config.state_dir, config.instance))
    k8s = config.runtime.kubernetes
    namespace = namespace_for(k8s, spec.tenant)
    proxy = None
    if proxy_ip is not None and spec.egress is not None:
        # the proxy's CA is the cluster's (its Secret): the Pod shows where it goes
        proxy = ProxyRef(proxy_ip, ca_placeholder(spec.egress))
    if k8s.provider == "agent-sandbox":
        # imported when the command runs: `sandbox --help` stays cheap
        from sandbox.runtime.kubernetes.agent_sandbox import provider_objects

        objects = provider_objects(spec, k8s, namespace, replicas=agent.sandbox.pool.size, proxy=proxy)
    else:
        objects = [sandbox_pod(spec, k8s, namespace, proxy=proxy)]
    if (claim := workspace_claim(spec, k8s, namespace)) is not None:
        objects.insert(0, claim)
    click.echo(_yaml(objects))


@k8s_group.command("seccomp")
def seccomp() -> None:
    """The strict seccomp profile (sandbox.docker.seccomp_profile: strict) as a file for the nodes:
    save it in the kubelet's seccomp folder (e.g. /var/lib/kubelet/seccomp/agent-sandbox/strict.json)
    and set runtime.kubernetes.seccomp: Localhost:agent-sandbox/strict.json."""
    # imported when the command runs: `sandbox --help` stays cheap
    from sandbox.runtime.seccomp import strict_profile_json

    click.echo(strict_profile_json())
