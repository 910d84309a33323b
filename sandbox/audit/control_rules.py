"""Rules about the orchestrator's control files and Unix sockets below mounts.

SBX-K001 (config, critical): a skills dir, the config file, the state dir, a hook's or the
orchestrator's code lies where some agent's sandboxes can write. Loading refuses such a config;
this rule is for configs built in code and for live containers made before the rule existed.
SBX-K002 (live, critical): a live container mounts read-write a folder holding a control file.
SBX-K003 (live, high): a Unix socket lies below a live container's mount (planted after
creation, say): the sandbox can connect to its server whatever the network mode.
"""

from __future__ import annotations

import os

from sandbox.audit.findings import Finding
from sandbox.audit.rule_helpers import Doc
from sandbox.config.binds import find_sockets
from sandbox.config.isolation import control_exposures, control_paths
from sandbox.config.models import Config

_FIX_CONTROL = (
    "move skills dirs, the config file, the state dir and hook code outside every writable workspace, "
    "rw bind and workspace_root (or make that workspace ro)"
)


def control_findings(config: Config) -> list[Finding]:
    """SBX-K001 for every control file or folder a sandbox of the config could rewrite."""
    return [
        Finding(
            "SBX-K001",
            "critical",
            f"{e.kind} writable from a sandbox",
            f"the {e.kind} {e.path} {e.relation} the {e.root.how} {e.root.path} of agent {e.root.agent.id} "
            f"({e.root.agent.key_path}): a sandboxed session could plant code or policy the host then uses",
            _FIX_CONTROL,
            f"agent {e.root.agent.id} (config)",
        )
        for e in control_exposures(config)
    ]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def live_control_findings(config: Config, doc: Doc, target: str) -> list[Finding]:
    """SBX-K002 and SBX-K003 for one live container."""
    out: list[Finding] = []
    binds = [m for m in doc.get("Mounts") or [] if m.get("Type", "bind") == "bind" and m.get("Source")]
    controls = control_paths(config)
    for m in binds:
        source = os.path.realpath(str(m["Source"]))
        if not m.get("RW"):
            continue
        for kind, path in controls:
            if _within(path, source):
                out.append(
                    Finding(
                        "SBX-K002",
                        "critical",
                        f"{kind} writable from a live sandbox",
                        f"{source} -> {m.get('Destination')} (rw) holds the {kind} {path}",
                        _FIX_CONTROL + "; then recreate the sandbox",
                        target,
                    )
                )
    scan = find_sockets(str(m["Source"]) for m in binds)
    if scan.sockets:
        shown = ", ".join(scan.sockets[:5]) + (f" (+{len(scan.sockets) - 5} more)" if len(scan.sockets) > 5 else "")
        out.append(
            Finding(
                "SBX-K003",
                "high",
                "Unix socket below a mount",
                f"{shown}: the sandbox can connect to it, read-only mount and network none notwithstanding",
                "remove the socket or move its server's socket dir out of the sandbox's mounts, then recreate it",
                target,
                "5.31",
            )
        )
    elif not scan.complete:
        out.append(
            Finding(
                "SBX-K003",
                "info",
                "socket scan incomplete",
                "the mounts hold more entries than the bounded scan reads; sockets deeper in were not looked for",
                "keep workspaces small, or audit their sockets with `find <dir> -type s`",
                target,
            )
        )
    return out
