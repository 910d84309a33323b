"""Container rules about bind mounts: propagation, sensitive host paths, sockets, writable binds."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from sandbox.audit.findings import Finding
from sandbox.audit.ownership import write_problem
from sandbox.audit.rule_helpers import Doc
from sandbox.config.binds import CONTAINER_WORKDIR, SYSTEM_PATHS, credential_paths
from sandbox.runtime.agent.fifo_link import INSIDE
from sandbox.runtime.spec import AGENT_LINKS_DIR


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


# set by run.py on a `volume` mount from `docker volume inspect`: the host path its driver binds
VOLUME_DEVICE = "_volume_device"
_SCRATCH_NAME = re.compile(r"[0-9a-f]{32}")  # naming.scratch_dir_name
_TENANT_DIR = re.compile(r"[0-9a-f]{16}")  # naming.tenant_dir_name
LINK_FIX = "remove the sandbox (`sandbox rm`): the orchestrator makes its link folder read-only, 0711"


def is_scratch(real: str, scratch_roots: Sequence[str]) -> bool:
    """Whether a resolved path is one of the orchestrator's scratch workspaces: a 32-hex folder in
    a 16-hex tenant folder of a configured workspace_root (or, as made before tenant folders,
    directly in the root). Nothing else under a root is exempt, so a root that holds more than
    scratch (a root of `/`, refused at load) exempts no other mount."""
    parent, name = os.path.split(real.rstrip("/"))
    if not _SCRATCH_NAME.fullmatch(name):
        return False
    grandparent, tenant_dir = os.path.split(parent)
    roots = {root.rstrip("/") for root in scratch_roots}
    return parent in roots or (bool(_TENANT_DIR.fullmatch(tenant_dir)) and grandparent in roots)


def agent_link_problem(real: str, m: dict[str, Any]) -> str | None:
    """What is wrong with a mount at the agents' link folder (runtime/link_folders.py): it must
    be one of ours (a 32-hex folder in an `agent-links` folder), read-only, and unlistable (0711)
    so nothing inside finds a FIFO it was not told of; None: nothing."""
    parent, name = os.path.split(real.rstrip("/"))
    if not (_SCRATCH_NAME.fullmatch(name) and os.path.basename(parent) == AGENT_LINKS_DIR):
        return "the source is not one of the orchestrator's link folders"
    if m.get("RW"):
        return "mounted read-write (the sandbox could plant files where its agents' FIFOs are made)"
    try:
        mode = os.stat(real).st_mode & 0o7777
    except OSError:
        return None  # not on this host (audited from elsewhere): the spelling is all there is
    if mode & 0o066:
        return f"mode {mode:o}: readable or writable by the sandbox (0711 expected)"
    return None


def mounts(doc: Doc, t: str, scratch_roots: Sequence[str] = ()) -> list[Finding]:
    """Bind rules; scratch workspaces in `scratch_roots` (see :func:`is_scratch`) are benign wherever they live."""
    out = []
    user = str((doc.get("Config") or {}).get("User") or "")
    cap_add = (doc.get("HostConfig") or {}).get("CapAdd") or []
    for m in doc.get("Mounts") or []:
        kind = m.get("Type", "bind")
        if kind == "bind":
            source = str(m.get("Source") or "")
            label = source
        elif kind == "volume" and m.get(VOLUME_DEVICE):
            # a local volume with `device` options is a bind by another name (run.py reads the options)
            source = str(m[VOLUME_DEVICE])
            label = f"volume {m.get('Name')} (device {source})"
        else:
            continue
        real = os.path.realpath(source) if source else source
        dest = str(m.get("Destination") or "")
        where = f"{label} -> {dest}" + (f" (resolves to {real})" if real != source else "")
        if dest == INSIDE and kind == "bind":
            # the agents' FIFOs, under the state dir wherever that lies (/root included)
            link_problem = agent_link_problem(real, m)
            if link_problem is None:
                continue
            out.append(
                Finding("SBX-M009", "high", "agent link folder not private", f"{where}: {link_problem}", LINK_FIX, t)
            )
            continue
        if str(m.get("Propagation") or "") in ("shared", "rshared"):
            out.append(
                Finding(
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
                Finding(
                    "SBX-M002", "critical", "socket mounted", where, "never mount sockets into a sandbox", t, "5.31"
                )
            )
        elif hits and not is_scratch(real, scratch_roots):
            blocked, rel = hits[0]
            out.append(
                Finding(
                    "SBX-M003",
                    "critical",
                    "sensitive host path mounted",
                    f"{where}: {rel} {blocked}",
                    "mount only project directories",
                    t,
                    "5.5",
                )
            )
        inside_workdir = dest.startswith(CONTAINER_WORKDIR + "/")  # the workspace's own pinned parents
        problem = write_problem(real, user, cap_add) if m.get("RW") and not inside_workdir else None
        if problem is not None:
            out.append(
                Finding(
                    "SBX-M008",
                    "medium",
                    "read-write mount the sandbox user cannot write",
                    f"{where}: {problem.detail}",
                    problem.fix,
                    t,
                )
            )
        # binds may not target /workspace/*: mounts there are the workspace's own pinned parents
        if m.get("RW") and dest != CONTAINER_WORKDIR and not inside_workdir:
            out.append(
                Finding(
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


def _covers(host: str, path: str) -> bool:
    return host == path or path.startswith(host.rstrip("/") + "/")


def _writable_through(path: str, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rw row of one sandbox through which host `path` is writable there, if any: a rw mount
    holding it, unless a read-only mount lies over that spot in the container (protected paths)."""
    mounted = [
        r for r in rows if str(r.get("host", "")).startswith("/") and str(r.get("container", "")).startswith("/")
    ]
    for writer in mounted:
        host = os.path.realpath(str(writer["host"]))
        if writer.get("mode") != "rw" or not _covers(host, path):
            continue
        rel = os.path.relpath(path, host)
        spot = os.path.normpath(os.path.join(str(writer["container"]), rel))
        over = [
            r
            for r in mounted
            if _covers(str(r["container"]), spot) and len(str(r["container"])) > len(str(writer["container"]))
        ]
        if not over or max(over, key=lambda r: len(str(r["container"]))).get("mode") == "rw":
            return writer
    return None


def mark_writable_elsewhere(table: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Show the effective mode of every read-only row: `rw` (verdict SBX-M007) when the same host
    path is writable through another mount, of this sandbox or another (a skills dir mounted ro
    but inside some agent's rw workspace). A read-only mount over that spot in the writer's own
    container (protected paths) keeps it read-only there."""
    for rows in table.values():
        for row in rows:
            if row.get("mode") != "ro" or not str(row.get("host", "")).startswith("/"):
                continue
            path = os.path.realpath(str(row["host"]))
            for writer_target, writer_rows in table.items():
                writer = _writable_through(path, writer_rows)
                if writer is not None:
                    row["mode"] = "rw"
                    verdict = str(row.get("verdict") or "ok")
                    row["verdict"] = "SBX-M007" if verdict == "ok" else f"{verdict}, SBX-M007"
                    row["from"] = f"{row.get('from', '')}; writable via {writer_target}: {writer['container']} (rw)"
                    break
    return table
