"""One audit: the config, this orchestrator's live sandboxes (or every container), the engine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import docker.errors

from sandbox.audit.config_docs import inspect_of
from sandbox.audit.config_rules import audit_config
from sandbox.audit.container_rules import audit_container
from sandbox.audit.control_rules import control_findings, live_control_findings
from sandbox.audit.egress_rules import pool_findings
from sandbox.audit.engine_rules import audit_engine
from sandbox.audit.findings import Finding
from sandbox.audit.isolation_rules import (
    browser_network_findings,
    live_shared_findings,
    senders_from_journal,
    shared_bind_findings,
)
from sandbox.audit.live_docs import enrich, image_findings
from sandbox.audit.mount_rules import mark_writable_elsewhere
from sandbox.config.merge import agent_ids, effective_agent
from sandbox.config.models import Config
from sandbox.errors import SandboxError
from sandbox.runtime.docker.errors import mapped
from sandbox.runtime.naming import Labels, instance_id


@dataclass(frozen=True)
class AuditResult:
    """Findings and the mount table per target."""

    findings: list[Finding]
    mounts: dict[str, list[dict[str, Any]]]


def _mount_rows(doc: dict[str, Any], findings: list[Finding]) -> list[dict[str, Any]]:
    rows = []
    # by the path inside: the engine lists a container's mounts in no fixed order
    for m in sorted(doc.get("Mounts") or [], key=lambda m: str(m.get("Destination") or "")):
        source = str(m.get("Source") or "")
        hits = sorted({f.rule for f in findings if f.rule.startswith("SBX-M") and source and source in f.evidence})
        rows.append(
            {
                "host": source,
                "container": m.get("Destination"),
                "mode": "rw" if m.get("RW") else "ro",
                "from": m.get("Origin", ""),
                "verdict": ", ".join(hits) or "ok",
            }
        )
    return rows


def scratch_roots(config: Config) -> list[str]:
    """Where the orchestrator makes scratch workspaces (their mounts are its own, not the host's)."""
    return sorted({os.path.realpath(str(effective_agent(config, a).sandbox.workspace_root)) for a in agent_ids(config)})


def _shared_agents(config: Config, tenant: str) -> list[str]:
    """The agents of a tenant whose sessions all use its one `shared` container."""
    out = []
    for agent_id in agent_ids(config):
        cfg = effective_agent(config, agent_id)
        if cfg.sandbox.scope == "shared" and cfg.sandbox.mode != "off" and cfg.tenant == tenant:
            out.append(agent_id)
    return out


def _users(config: Config, labels: dict[str, str]) -> str:
    """Who a live container serves, for its heading: its agent, or every agent of a shared one."""
    if labels.get(Labels.SCOPE) == "shared":
        tenant = labels.get(Labels.TENANT, "?")
        return f"shared by agents {', '.join(_shared_agents(config, tenant)) or '?'} of tenant {tenant}"
    return f"agent {labels.get(Labels.AGENT)}"


def mount_map(config: Config) -> dict[str, list[dict[str, Any]]]:
    """For every agent: each host path its sandboxes reach, the mode, and the config key behind it.

    An agent in `scope: shared` reaches what the one shared container mounts, whichever agent's
    session made it: its rows are its own config's, plus (verdict SBX-S001) any mount another
    agent sharing the container would bring.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    docs: dict[str, dict[str, Any]] = {}
    for agent_id in agent_ids(config):
        agent = effective_agent(config, agent_id)
        target = f"agent {agent_id} (config)"
        if agent.sandbox.mode == "off":
            out[target] = [
                {
                    "host": str(agent.workspace),
                    "container": "(host)",
                    "mode": "rw",
                    "from": f"{agent.key_path}.workspace (mode off: tools run on the host)",
                    "verdict": "host",
                }
            ]
            continue
        try:
            docs[agent_id] = inspect_of(config, agent_id, f"agent:{agent_id}:audit-non-main")
        except SandboxError as exc:
            out[target] = [{"host": "?", "container": "?", "mode": "?", "from": exc.message, "verdict": "refused"}]
            continue
        out[target] = _mount_rows(docs[agent_id], [])
    for agent_id in docs:
        agent = effective_agent(config, agent_id)
        if agent.sandbox.scope != "shared":
            continue
        sharers = _shared_agents(config, agent.tenant)
        target = f"agent {agent_id} (config)"
        heading = f"agent {agent_id} (config; shared container with agents {', '.join(sharers)})"
        rows = out.pop(target)
        seen = {(r["host"], r["container"], r["mode"]) for r in rows}
        for other in sharers:
            if other == agent_id or other not in docs:
                continue
            for row in _mount_rows(docs[other], []):
                if (row["host"], row["container"], row["mode"]) not in seen:
                    seen.add((row["host"], row["container"], row["mode"]))
                    rows.append({**row, "from": f"agent {other}: {row['from']}", "verdict": "SBX-S001"})
        out[heading] = rows
    return mark_writable_elsewhere(out)


def run_audit(config: Config, client: Any | None, *, all_containers: bool = False) -> AuditResult:
    """Audit the config, and with an engine client its live containers and the engine itself.

    Raises:
        SandboxError: the engine failed or could not be reached (mapped like every engine call).
    """
    if client is None:
        return _run_audit(config, None, all_containers=all_containers)
    with mapped("audit"):
        return _run_audit(config, client, all_containers=all_containers)


def _inspect_or_none(client: Any, container_id: str) -> dict[str, Any] | None:
    try:
        return dict(client.api.inspect_container(container_id))
    except docker.errors.NotFound:  # removed between the listing and its inspect: simply not there any more
        return None


def _run_audit(config: Config, client: Any | None, *, all_containers: bool = False) -> AuditResult:
    scratch = scratch_roots(config)
    findings = audit_config(config, scratch, senders_from_journal(config)) + control_findings(config)
    mounts = mount_map(config)
    if client is None:
        return AuditResult(findings, mounts)
    info = dict(client.info())
    for component in client.version().get("Components") or []:
        if str(component.get("Name", "")).lower() == "runc":
            info["_runc_version"] = component.get("Version", "")
    findings += audit_engine(info) + image_findings(client, config) + pool_findings(config, client)
    filters: dict[str, Any] = (
        {}
        if all_containers
        else {
            "label": [f"{Labels.MANAGED}=true", f"{Labels.INSTANCE}={instance_id(config.state_dir, config.instance)}"]
        }
    )
    tenants_by_source: dict[str, set[str]] = {}
    for summary in client.api.containers(all=True, filters=filters):
        inspected = _inspect_or_none(client, summary["Id"])
        if inspected is None:
            continue
        doc = enrich(client, inspected)
        labels = doc.get("Config", {}).get("Labels") or {}
        kind = labels.get(Labels.KIND, "")
        target = f"container {doc['Name'].lstrip('/')}" + (f" ({_users(config, labels)}, {kind})" if kind else "")
        found = (
            audit_container(doc, target, scratch)
            + live_shared_findings(config, doc, target)
            + live_control_findings(config, doc, target)
        )
        if kind == "browser":
            found = [f for f in found if f.rule != "SBX-C025"]  # CDP on loopback is the design
            for port, bindings in (doc.get("HostConfig", {}).get("PortBindings") or {}).items():
                for b in bindings or []:
                    if (b.get("HostIp") or "0.0.0.0") != "127.0.0.1":  # noqa: S104
                        found.append(
                            Finding(
                                "SBX-B001",
                                "high",
                                "browser CDP/VNC published beyond loopback",
                                f"{port} -> {b.get('HostIp') or 'all interfaces'}",
                                "publish on 127.0.0.1 only",
                                target,
                            )
                        )
        if kind == "exec":
            networks = (doc.get("NetworkSettings") or {}).get("Networks") or {}
            browser_net = config.agents.defaults.sandbox.browser.network
            found += browser_network_findings(networks, browser_net, "attached to", target)
        findings += found
        mounts[target] = _mount_rows(doc, found)
        for m in doc.get("Mounts") or []:
            if m.get("Type") == "bind":
                tenants_by_source.setdefault(str(m.get("Source")), set()).add(labels.get(Labels.TENANT, "?"))
    return AuditResult(findings + shared_bind_findings(tenants_by_source, "engine"), mounts)
