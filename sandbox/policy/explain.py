"""`sandbox explain`: a resolved policy as data and as text a person can read."""

from __future__ import annotations

from typing import Any

from sandbox.policy.resolver import ResolvedPolicy


def explain_data(policy: ResolvedPolicy) -> dict[str, Any]:
    """The JSON shape of `sandbox explain --json`."""
    status = policy.sandbox
    return {
        "agent": policy.agent.id,
        "session": policy.session.raw,
        "sandboxed": status.sandboxed,
        "sandbox": {
            "mode": status.mode,
            "scope": status.scope,
            "workspace_access": status.workspace_access,
            "reason": status.reason,
        },
        "preview": _preview(policy),
        "layers": [{"name": t.layer.name, "remaining": sorted(t.remaining)} for t in policy.trace],
        "tools": [
            {
                "name": d.tool,
                "allowed": d.allowed,
                "layer": d.layer,
                "list": d.kind,
                "pattern": d.pattern,
                "key": d.key,
                "fix": d.fix,
            }
            for d in policy.decisions
        ],
    }


def _preview(policy: ResolvedPolicy) -> dict[str, Any]:
    """Which of the sandbox's loopback ports the service may show (docs/preview.md)."""
    preview = policy.agent.sandbox.preview
    ports = list(preview.ports) if policy.sandbox.sandboxed else []
    return {
        "ports": ports,
        "link_ttl_s": preview.link_ttl_s,
        "max_connections": preview.max_connections,
        "key": f"{policy.agent.key_path}.sandbox.preview.ports",
    }


def _preview_text(policy: ResolvedPolicy) -> str:
    found = _preview(policy)
    if not found["ports"]:
        why = "not sandboxed" if not policy.sandbox.sandboxed else f"{found['key']} lists none"
        return f"off ({why})"
    ports = ", ".join(map(str, found["ports"]))
    return f"ports {ports} of the sandbox's loopback, links for at most {found['link_ttl_s']} s"


def explain_text(policy: ResolvedPolicy) -> str:
    """The human rendering of `sandbox explain`."""
    status = policy.sandbox
    lines = [
        f"agent    {policy.agent.id} (tenant {policy.agent.tenant})",
        f"session  {policy.session.raw}",
        f"sandbox  {'yes' if status.sandboxed else 'no'}: {status.reason}",
        f"         scope {status.scope}, workspace {status.workspace_access}",
        f"preview  {_preview_text(policy)}",
        f"layers   {' -> '.join(t.layer.name for t in policy.trace)}",
        "",
        f"{'tool':<18} {'':<7} {'decided by':<22} {'pattern':<16} why / fix",
    ]
    for d in policy.decisions:
        mark = "allow" if d.allowed else "DENY"
        layer = d.layer or "-"
        pattern = d.pattern or ("(not listed)" if not d.allowed else "-")
        why = d.fix if not d.allowed else (d.key or "no layer restricts it")
        lines.append(f"{d.tool:<18} {mark:<7} {layer:<22} {pattern:<16} {why}")
    allowed = [d.tool for d in policy.decisions if d.allowed]
    lines += ["", f"{len(allowed)} of {len(policy.decisions)} tools exist for this session"]
    return "\n".join(lines)
