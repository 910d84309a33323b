"""Rules over one container's `docker inspect` document (live, or built from the config).

Each rule returns findings; a rule that finds nothing returns []. The same rules run on the
config (through `config_view.inspect_of`) and on live containers, so both say the same thing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from sandbox.audit.findings import Finding, Severity
from sandbox.runtime.binds import CONTAINER_WORKDIR, SYSTEM_PATHS, credential_paths

Doc = dict[str, Any]
SAFE_SYSCTLS = frozenset(
    {
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
    }
)
ALLOWED_CAP_ADD = frozenset({"NET_BIND_SERVICE", "CAP_NET_BIND_SERVICE"})


def _f(rule: str, sev: Severity, title: str, evidence: str, fix: str, target: str, cis: str = "") -> Finding:
    return Finding(rule, sev, title, evidence, fix, target, cis)


def _host(doc: Doc) -> dict[str, Any]:
    return dict(doc.get("HostConfig") or {})


def privileged(doc: Doc, t: str) -> list[Finding]:
    if _host(doc).get("Privileged"):
        return [
            _f(
                "SBX-C001",
                "critical",
                "privileged container",
                "HostConfig.Privileged is true",
                "never run sandboxes privileged",
                t,
                "5.4",
            )
        ]
    return []


def capabilities(doc: Doc, t: str) -> list[Finding]:
    host = _host(doc)
    out = []
    drops = [c.upper().removeprefix("CAP_") for c in host.get("CapDrop") or []]
    if "ALL" not in drops:
        out.append(
            _f(
                "SBX-C002",
                "high",
                "capabilities not all dropped",
                f"CapDrop is {drops or 'empty'}",
                "set docker.cap_drop: [ALL]",
                t,
                "5.3",
            )
        )
    added = [c for c in host.get("CapAdd") or [] if c.upper() not in ALLOWED_CAP_ADD]
    if added:
        out.append(
            _f(
                "SBX-C003",
                "high",
                "capabilities added",
                f"CapAdd is {added}",
                "remove docker.cap_add entries (only NET_BIND_SERVICE is tolerated)",
                t,
                "5.3",
            )
        )
    return out


def security_options(doc: Doc, t: str) -> list[Finding]:
    opts = [str(o) for o in _host(doc).get("SecurityOpt") or []]
    out = []
    if not any(o.replace("=", ":") in ("no-new-privileges:true", "no-new-privileges") for o in opts):
        out.append(
            _f(
                "SBX-C004",
                "high",
                "no-new-privileges not set",
                f"SecurityOpt is {opts or 'empty'}",
                "keep docker.no_new_privileges: true",
                t,
                "5.25",
            )
        )
    if any(o.replace(":", "=") == "seccomp=unconfined" for o in opts):
        out.append(
            _f(
                "SBX-C005",
                "high",
                "seccomp unconfined",
                "SecurityOpt has seccomp=unconfined",
                "remove docker.seccomp_profile: unconfined",
                t,
                "5.21",
            )
        )
    if any(o.replace(":", "=") == "apparmor=unconfined" for o in opts):
        out.append(
            _f(
                "SBX-C006",
                "medium",
                "AppArmor unconfined",
                "SecurityOpt has apparmor=unconfined",
                "remove docker.apparmor_profile: unconfined",
                t,
                "5.1",
            )
        )
    if any(o.replace(":", "=") == "label=disable" for o in opts):
        out.append(
            _f(
                "SBX-C007",
                "medium",
                "SELinux labels disabled",
                "SecurityOpt has label=disable",
                "do not disable SELinux labelling",
                t,
                "5.2",
            )
        )
    return out


def namespaces(doc: Doc, t: str) -> list[Finding]:
    host = _host(doc)
    out = []
    net = str(host.get("NetworkMode") or "")
    if net == "host":
        out.append(
            _f(
                "SBX-C008",
                "critical",
                "host network namespace",
                "NetworkMode is host",
                "use docker.network: none (the default)",
                t,
                "5.9",
            )
        )
    elif net.startswith("container:"):
        out.append(
            _f(
                "SBX-C009",
                "high",
                "joins another container's network",
                f"NetworkMode is {net}",
                "give the sandbox its own network namespace",
                t,
                "5.9",
            )
        )
    for key, rule, cis in (
        ("PidMode", "SBX-C010", "5.15"),
        ("IpcMode", "SBX-C011", "5.16"),
        ("UTSMode", "SBX-C012", "5.20"),
        ("UsernsMode", "SBX-C013", "5.30"),
    ):
        if str(host.get(key) or "") == "host":
            out.append(
                _f(
                    rule,
                    "critical" if key == "PidMode" else "high",
                    f"host {key[:-4].upper()} namespace",
                    f"{key} is host",
                    f"do not share the host's {key[:-4]} namespace",
                    t,
                    cis,
                )
            )
    return out


def limits(doc: Doc, t: str) -> list[Finding]:
    host = _host(doc)
    out = []
    memory = host.get("Memory") or 0
    if not memory:
        out.append(
            _f("SBX-C014", "medium", "no memory limit", "HostConfig.Memory is 0", "set docker.memory", t, "5.10")
        )
    elif (host.get("MemorySwap") or 0) not in (memory,):
        out.append(
            _f(
                "SBX-C015",
                "low",
                "swap not equal to memory",
                f"MemorySwap {host.get('MemorySwap')} != Memory {memory}",
                "leave docker.memory_swap unset (= memory)",
                t,
                "5.10",
            )
        )
    if not (host.get("NanoCpus") or host.get("CpuQuota") or host.get("CpuShares")):
        out.append(
            _f(
                "SBX-C016",
                "low",
                "no CPU limit",
                "NanoCpus, CpuQuota and CpuShares are unset",
                "set docker.cpus",
                t,
                "5.11",
            )
        )
    pids = host.get("PidsLimit")
    if not pids or pids <= 0:
        out.append(
            _f("SBX-C017", "medium", "no pids limit", f"PidsLimit is {pids}", "set docker.pids_limit", t, "5.29")
        )
    return out


def filesystem(doc: Doc, t: str) -> list[Finding]:
    host = _host(doc)
    out = []
    if not host.get("ReadonlyRootfs"):
        out.append(
            _f(
                "SBX-C018",
                "medium",
                "root filesystem writable",
                "ReadonlyRootfs is false",
                "keep docker.read_only_root: true",
                t,
                "5.13",
            )
        )
    unsized = [p for p, o in (host.get("Tmpfs") or {}).items() if "size=" not in str(o)]
    if unsized:
        out.append(
            _f(
                "SBX-C019",
                "low",
                "tmpfs without a size",
                f"no size= for {unsized}",
                "give every docker.tmpfs entry a size=",
                t,
            )
        )
    if host.get("Devices") or host.get("DeviceCgroupRules"):
        out.append(
            _f(
                "SBX-C020",
                "high",
                "host devices exposed",
                f"Devices {host.get('Devices')}, rules {host.get('DeviceCgroupRules')}",
                "do not pass devices into sandboxes",
                t,
                "5.17",
            )
        )
    bad = sorted(k for k in (host.get("Sysctls") or {}) if k not in SAFE_SYSCTLS)
    if bad:
        out.append(
            _f(
                "SBX-C021",
                "medium",
                "sysctls outside the safe list",
                f"Sysctls {bad}",
                "remove them (Pod Security restricted allows only the safe set)",
                t,
            )
        )
    if host.get("MaskedPaths") == [] or host.get("ReadonlyPaths") == []:
        out.append(
            _f(
                "SBX-C022",
                "high",
                "masked or read-only paths emptied",
                "MaskedPaths or ReadonlyPaths is empty (e.g. systempaths=unconfined)",
                "keep the engine's default masked and read-only /proc paths",
                t,
            )
        )
    return out


def ports_restart_user(doc: Doc, t: str) -> list[Finding]:
    host = _host(doc)
    out = []
    for port, bindings in (host.get("PortBindings") or {}).items():
        for b in bindings or []:
            ip = b.get("HostIp") or "0.0.0.0"  # noqa: S104 - describing, not binding
            hport = int(b.get("HostPort") or 0)
            if ip in ("0.0.0.0", "::", ""):  # noqa: S104
                out.append(
                    _f(
                        "SBX-C023",
                        "high",
                        "port published on all interfaces",
                        f"{port} -> {ip}:{hport or 'random'}",
                        "publish on 127.0.0.1 only",
                        t,
                        "5.14",
                    )
                )
            elif 0 < hport < 1024:
                out.append(
                    _f(
                        "SBX-C024",
                        "medium",
                        "privileged host port",
                        f"{port} -> {ip}:{hport}",
                        "use a host port >= 1024",
                        t,
                        "5.8",
                    )
                )
            else:
                out.append(
                    _f(
                        "SBX-C025",
                        "info",
                        "port published on loopback",
                        f"{port} -> {ip}:{hport or 'random'}",
                        "expected only for the browser's CDP port",
                        t,
                        "5.7",
                    )
                )
    restart = (host.get("RestartPolicy") or {}).get("Name") or "no"
    if restart not in ("no", ""):
        out.append(
            _f(
                "SBX-C026",
                "low",
                "restart policy set",
                f"RestartPolicy is {restart}",
                "sandboxes are recreated on demand; use no",
                t,
                "5.15",
            )
        )
    user = str((doc.get("Config") or {}).get("User") or "")
    if user.split(":")[0] in ("", "0", "root") and str(host.get("UsernsMode") or "") != "private":
        out.append(
            _f(
                "SBX-C027",
                "high",
                "runs as root",
                f"Config.User is {user or 'unset'}",
                "leave docker.user unset (the workspace owner, else 1000:1000)",
                t,
                "4.1",
            )
        )
    return out


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
                _f(
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
                _f("SBX-M002", "critical", "socket mounted", where, "never mount sockets into a sandbox", t, "5.31")
            )
        elif hits and not any(real == r or real.startswith(r.rstrip("/") + "/") for r in scratch_roots):
            blocked, rel = hits[0]
            out.append(
                _f(
                    "SBX-M003",
                    "critical",
                    "sensitive host path mounted",
                    f"{where}: {rel} {blocked}",
                    "mount only project directories",
                    t,
                    "5.5",
                )
            )
        if m.get("RW") and dest != CONTAINER_WORKDIR:
            out.append(
                _f(
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


CONTAINER_RULES: tuple[Callable[[Doc, str], list[Finding]], ...] = (
    privileged,
    capabilities,
    security_options,
    namespaces,
    limits,
    filesystem,
    ports_restart_user,
)


def audit_container(doc: Doc, target: str, scratch_roots: Sequence[str] = ()) -> list[Finding]:
    """Every container rule over one inspect document."""
    found = [finding for rule in CONTAINER_RULES for finding in rule(doc, target)]
    return found + mounts(doc, target, scratch_roots)
