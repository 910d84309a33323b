"""Rules about what agents, tenants and senders share: overlapping workspaces, a workspace that
holds the state dir or a workspace_root, shared containers across differing sandboxes or
tenants, and sessions of different senders meeting in one container.

Loading refuses the first three; these rules still run, because a config can reach the
orchestrator without loading (built in code) and live containers outlast the config that
made them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sandbox.audit.config_docs import inspect_of
from sandbox.audit.findings import Finding
from sandbox.audit.mount_rules import is_scratch
from sandbox.config.isolation import overlaps, shared_mismatches
from sandbox.config.merge import agent_ids, effective_agent
from sandbox.config.models import Config
from sandbox.journal.store import Journal
from sandbox.runtime.naming import Labels
from sandbox.runtime.session_users import uses_session_users

FIX_OWN_DIRS = "give every agent its own directory, outside the state_dir and every workspace_root"


def workspace_findings(config: Config) -> list[Finding]:
    """SBX-W001 overlapping workspaces (critical across tenants); SBX-W002 a workspace holding state."""
    out = []
    for o in overlaps(config):
        target = f"agent {o.agent.id} (config)"
        mine = os.path.realpath(o.agent.workspace)
        if o.other_agent is not None:
            across = o.other_agent.tenant != o.agent.tenant
            out.append(
                Finding(
                    "SBX-W001",
                    "critical" if across else "high",
                    "workspaces overlap across " + ("tenants" if across else "agents"),
                    f"{mine} ({o.agent.key_path}, tenant {o.agent.tenant}) {o.relation} {o.other} "
                    f"(agent {o.other_agent.id}, tenant {o.other_agent.tenant})",
                    FIX_OWN_DIRS,
                    target,
                )
            )
        else:
            out.append(
                Finding(
                    "SBX-W002",
                    "critical",
                    f"workspace holds the {o.kind}",
                    f"{mine} ({o.agent.key_path}) {o.relation} the {o.kind} {o.other}: a sandbox writing there "
                    "can plant links the orchestrator follows or rewrite its state",
                    FIX_OWN_DIRS,
                    target,
                )
            )
    return out


def shared_findings(config: Config) -> list[Finding]:
    """SBX-S001: agents sharing one `shared` container whose sandboxes differ (critical across tenants)."""
    out = []
    for m in shared_mismatches(config):
        across = "tenant" in m.keys
        out.append(
            Finding(
                "SBX-S001",
                "critical" if across else "high",
                "shared container across " + ("tenants" if across else "differing sandboxes"),
                f"agents {m.first.id} and {m.other.id} use scope shared but differ in {', '.join(m.keys)}",
                "make their sandboxes identical (one tenant) or use scope agent",
                f"agent {m.other.id} (config)",
            )
        )
    return out


def _mount_set(mounts: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, bool]]:
    return {
        (str(m.get("Source")), str(m.get("Destination")), bool(m.get("RW")))
        for m in mounts
        if m.get("Type", "bind") == "bind"
    }


def preview_findings(config: Config) -> list[Finding]:
    """SBX-V001: an agent whose sandboxes' ports the service shows (previews, docs/preview.md);
    SBX-V002: the same where sessions share a container and one uid, so a session's link reaches
    whatever any session of that container serves on the port."""
    out = []
    for agent_id in agent_ids(config):
        agent = effective_agent(config, agent_id)
        cfg = agent.sandbox
        if cfg.mode == "off" or not cfg.preview.ports:
            continue
        ports = ", ".join(map(str, cfg.preview.ports))
        target = f"agent {agent_id} (config)"
        key = f"{agent.key_path}.sandbox.preview.ports"
        out.append(
            Finding(
                "SBX-V001",
                "info",
                "sandbox ports shown through the service",
                f"{key} lists {ports}: a server a session starts on one of them is shown to its tenant's "
                f"token and to anyone holding a link it makes (links last at most {cfg.preview.link_ttl_s} s)",
                f"list only the ports people need to see; shorten {agent.key_path}.sandbox.preview.link_ttl_s",
                target,
            )
        )
        user = cfg.docker.user or "1000:1000"  # a workspace owner's uid is numeric too (runtime/spec.py)
        if cfg.scope != "session" and not uses_session_users(cfg.session_users, cfg.scope, cfg.workspace_access, user):
            out.append(
                Finding(
                    "SBX-V002",
                    "medium",
                    "previews of a container sessions share as one user",
                    f"scope {cfg.scope} without uids per session: a link of one session reaches whatever any "
                    f"session of the container serves on ports {ports}",
                    "use scope: session, or session_users: on, so a session reaches only its own servers",
                    target,
                )
            )
    return out


def live_shared_findings(config: Config, doc: Mapping[str, Any], target: str) -> list[Finding]:
    """SBX-S001 on a live `shared` container: an agent of its tenant would get other mounts than it has."""
    labels = (doc.get("Config") or {}).get("Labels") or {}
    if labels.get(Labels.SCOPE) != "shared" or labels.get(Labels.KIND) != "exec":
        return []
    live = _mount_set(doc.get("Mounts") or [])
    out = []
    for agent_id in agent_ids(config):
        agent = effective_agent(config, agent_id)
        cfg = agent.sandbox
        if cfg.scope != "shared" or cfg.mode == "off" or agent.tenant != labels.get(Labels.TENANT):
            continue
        try:
            wanted = _mount_set(inspect_of(config, agent_id, f"agent:{agent_id}:audit-non-main")["Mounts"])
        except Exception:  # noqa: S112 - a refused bind is reported by the config rules
            continue
        if wanted != live:
            missing = sorted(f"{s} -> {d}" for s, d, _ in wanted - live)
            extra = sorted(f"{s} -> {d}" for s, d, _ in live - wanted)
            out.append(
                Finding(
                    "SBX-S001",
                    "high",
                    "shared container differs from an agent using it",
                    f"agent {agent_id} (tenant {agent.tenant}) would use it; it mounts {extra or 'nothing else'} "
                    f"that agent {agent_id}'s sandbox does not, and lacks {missing or 'nothing'}",
                    "recreate it (`sandbox recreate --all`) after making the shared agents' sandboxes identical",
                    target,
                )
            )
    return out


def senders_from_journal(config: Config) -> dict[str, set[str]]:
    """agent id -> the senders seen in its journaled calls (empty when there is no journal)."""
    path = config.state_dir / "journal.sqlite3"
    if not path.exists():
        return {}
    journal = Journal(path)
    try:
        events = journal.events(limit=100_000)
    finally:
        journal.close()
    out: dict[str, set[str]] = {}
    for event in events:
        sender = event.data.get("sender") if event.stage == "proposed" else None
        if sender:
            out.setdefault(event.agent, set()).add(str(sender))
    return out


def sender_findings(config: Config, senders: Mapping[str, set[str]]) -> list[Finding]:
    """SBX-S002 (info): one container serves sessions of different senders (agent or shared scope)."""
    configured = sorted(config.tools.approvals.by_sender)
    groups: dict[str, tuple[list[str], set[str]]] = {}
    for agent_id in agent_ids(config):
        agent = effective_agent(config, agent_id)
        cfg = agent.sandbox
        if cfg.mode == "off" or cfg.scope == "session":
            continue
        key = f"shared container of tenant {agent.tenant}" if cfg.scope == "shared" else f"agent {agent_id}"
        agents, seen = groups.setdefault(key, ([], set()))
        agents.append(agent_id)
        seen.update(senders.get(agent_id, set()))
    out = []
    for key, (agents, seen) in sorted(groups.items()):
        evidence = _sender_evidence(sorted(seen), configured)
        if evidence:
            scope = "shared" if key.startswith("shared") else "agent"
            out.append(
                Finding(
                    "SBX-S002",
                    "info",
                    "sessions of different senders share a container",
                    f"{key} (agents {', '.join(agents)}, scope {scope}): {evidence}; they see each other's "
                    "files, processes and /tmp",
                    "use scope session where senders must not see each other",
                    f"agent {agents[0]} (config)",
                )
            )
    return out


def _sender_evidence(seen: Sequence[str], configured: Sequence[str]) -> str:
    if len(seen) > 1:
        return f"the journal shows senders {', '.join(seen)}"
    if len(configured) > 1:
        return f"tools.approvals.by_sender names senders {', '.join(configured)}"
    return ""


def shared_bind_findings(
    tenants_by_source: Mapping[str, set[str]], target: str, scratch_roots: Sequence[str] = ()
) -> list[Finding]:
    """SBX-M006: one host path mounted for agents of different tenants (`scratch_roots`: see
    :func:`sandbox.audit.mount_rules.is_scratch`; those folders are the orchestrator's own)."""
    return [
        Finding(
            "SBX-M006",
            "high",
            "bind shared by agents of different tenants",
            f"{source} is mounted for tenants {sorted(tenants)}",
            "give each tenant its own directories",
            target,
        )
        for source, tenants in sorted(tenants_by_source.items())
        if len(tenants) > 1 and not is_scratch(source, scratch_roots)
    ]


def browser_network_findings(networks: Iterable[str], browser_network: str, where: str, target: str) -> list[Finding]:
    """SBX-B002: an exec sandbox on the browser network or a tenant's copy of it (`<network>-<tenant>`);
    `where` says how the sandbox got there (its config key, or what the engine reports)."""
    joined = sorted(n for n in networks if n == browser_network or n.startswith(f"{browser_network}-"))
    if not joined:
        return []
    return [
        Finding(
            "SBX-B002",
            "high",
            "exec sandbox on the browser network",
            f"{where} {', '.join(joined)}",
            "the exec sandbox never joins the browser network: set docker.network: none, disconnect a live one",
            target,
        )
    ]
