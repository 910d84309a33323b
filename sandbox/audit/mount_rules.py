"""Container rules about bind mounts: propagation, sensitive host paths, sockets, writable binds."""

from __future__ import annotations

import os
from collections.abc import Sequence

from sandbox.audit.findings import Finding
from sandbox.audit.rule_helpers import Doc, finding
from sandbox.runtime.binds import CONTAINER_WORKDIR, SYSTEM_PATHS, credential_paths


def _relation(path: str, blocked: str) -> str | None:
    if path == blocked:
        return "is"
    if blocked == "/":
        return None  # everything lies under /; only / itself is refused
    if path.startswith(blocked.rstrip("/") + "/"):
        return "lies under"
    if blocked.startswith(path.rstrip("/") + "/"):
        return "is an ancestor of"
    return None


def mounts(doc: Doc, t: str, scratch_roots: Sequence[str] = ()) -> list[Finding]:
    """Bind rules; `scratch_roots` hold orchestrator-made scratch workspaces (benign wherever they live)."""
    out = []
    for m in doc.get("Mounts") or []:
        if m.get("Type", "bind") != "bind":
            continue
        source = str(m.get("Source") or "")
        real = os.path.realpath(source) if source else source
        dest = str(m.get("Destination") or "")
        where = f"{source} -> {dest}" + (f" (resolves to {real})" if real != source else "")
        if str(m.get("Propagation") or "") in ("shared", "rshared"):
            out.append(
                finding(
                    "SBX-M001",
                    "high",
                    "shared mount propagation",
                    f"{where} propagation {m['Propagation']}",
                    "use private propagation (the default here)",
                    t,
                    "5.19",
                )
            )
        hits = [(b, r) for b in ("/", *SYSTEM_PATHS, "/home", *credential_paths()) if (r := _relation(real, b))]
        if real.endswith(".sock") or "docker.sock" in real:
            out.append(
                finding(
                    "SBX-M002", "critical", "socket mounted", where, "never mount sockets into a sandbox", t, "5.31"
                )
            )
        elif hits and not any(real == r or real.startswith(r.rstrip("/") + "/") for r in scratch_roots):
            blocked, rel = hits[0]
            out.append(
                finding(
                    "SBX-M003",
                    "critical",
                    "sensitive host path mounted",
                    f"{where}: {rel} {blocked}",
                    "mount only project directories",
                    t,
                    "5.5",
                )
            )
        # binds may not target /workspace/*: mounts there are the workspace's own pinned parents
        if m.get("RW") and dest != CONTAINER_WORKDIR and not dest.startswith(CONTAINER_WORKDIR + "/"):
            out.append(
                finding(
                    "SBX-M004",
                    "medium",
                    "writable bind that is not the workspace",
                    where,
                    "make extra binds :ro",
                    t,
                    "5.5",
                )
            )
    return out
