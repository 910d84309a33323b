"""Configs and rendered objects for the Kubernetes tests (no cluster: the objects are data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox.config import Config, load_config_text
from sandbox.config.merge import effective_agent
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.kubernetes.pod import ProxyRef, sandbox_pod, workspace_claim
from sandbox.runtime.kubernetes.proxy_ca import ca_placeholder
from sandbox.runtime.kubernetes.tenant import Orchestrator, tenant_objects
from sandbox.runtime.spec import SandboxSpec, spec_from_config

# every kind of sandbox a Pod is rendered for: workspace none / ro / rw, shared scope, egress
AGENTS = """
agents:
  defaults:
    sandbox: {mode: all, scope: session}
  list:
    - {id: scratch, tenant: acme, workspace: ws-scratch}
    - {id: reader, tenant: acme, workspace: ws-reader, sandbox: {workspace_access: ro}}
    - {id: coder, tenant: acme, workspace: ws-coder, sandbox: {workspace_access: rw, scope: agent}}
    - {id: team, tenant: Beta_Corp, workspace: ws-team, sandbox: {workspace_access: rw, scope: shared}}
    - id: web
      tenant: acme
      workspace: ws-web
      sandbox:
        docker: {network: egress, memory: 2g, cpus: 2}
        egress: {allow: [pypi.org, files.pythonhosted.org], ports: [443]}
"""


def k8s_config(tmp_path: Path, kubernetes: str = "", extra: str = "") -> Config:
    """A config with the five agents above, two tenants with quotas, and `runtime.kubernetes`."""
    for name in ("ws-scratch", "ws-reader", "ws-coder", "ws-team", "ws-web"):
        (tmp_path / name).mkdir(exist_ok=True)
    text = f"""
state_dir: {tmp_path / "state"}
runtime:
  backend: kubernetes
  kubernetes:
    storage_class: standard
    shared_storage_class: nfs-rwx
    seccomp: Localhost:agent-sandbox/strict.json
{kubernetes}
tenants:
  - id: acme
    quotas: {{max_sandboxes: 8, max_workspace_bytes: 50g}}
  - id: Beta_Corp
{AGENTS}
{extra}
"""
    return load_config_text(text, base_dir=tmp_path)


def spec_of(config: Config, agent: str, session: str = "agent:x:s1") -> SandboxSpec:
    """The spec a session of `agent` gets."""
    return spec_from_config(config, effective_agent(config, agent), session, "inst01")


def pod_objects(config: Config, agent: str, proxy_ip: str = "10.96.7.7") -> list[dict[str, Any]]:
    """The claim (when any) and the Pod of a session of `agent`."""
    spec = spec_of(config, agent)
    k8s = config.runtime.kubernetes
    namespace = namespace_for(k8s, spec.tenant)
    claim = workspace_claim(spec, k8s, namespace)
    proxy = ProxyRef(proxy_ip, ca_placeholder(spec.egress)) if spec.egress is not None else None
    return [*([claim] if claim else []), sandbox_pod(spec, k8s, namespace, proxy=proxy)]


def every_object(config: Config) -> list[dict[str, Any]]:
    """Every tenant's objects and every agent's Pod and claim."""
    objects: list[dict[str, Any]] = []
    for tenant in config.tenants:
        objects += tenant_objects(config, tenant, Orchestrator())
    for agent in ("scratch", "reader", "coder", "team", "web"):
        objects += pod_objects(config, agent)
    return objects


def one_agent_config(tmp_path: Path, instance: str, sandbox: str, kubernetes: str = "", timeout_s: int = 60) -> Config:
    """One tenant (acme) and one agent (main, its workspace `tmp_path/ws`) on the kubernetes
    backend: `sandbox` is the agent's sandbox as a YAML flow mapping, `kubernetes` more entries of
    `runtime.kubernetes` (flow style)."""
    (tmp_path / "ws").mkdir(exist_ok=True)
    extra = f", {kubernetes}" if kubernetes else ""
    text = f"""
state_dir: {tmp_path / "state"}
instance: {instance}
runtime:
  backend: kubernetes
  kubernetes: {{pod_ready_timeout_s: {timeout_s}, seccomp: "Localhost:agent-sandbox/strict.json"{extra}}}
tenants: [{{id: acme}}]
agents:
  list:
    - {{id: main, tenant: acme, default: true, workspace: {tmp_path / "ws"}, sandbox: {sandbox}}}
"""
    return load_config_text(text, base_dir=tmp_path)
