"""Container rules about resources, the filesystem, ports, restart policy and the user."""

from __future__ import annotations

from sandbox.audit.findings import Finding
from sandbox.audit.rule_helpers import Doc, host_config
from sandbox.audit.spellings import is_root_user

SAFE_SYSCTLS = frozenset(
    {
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
    }
)


def limits(doc: Doc, t: str) -> list[Finding]:
    host = host_config(doc)
    out = []
    memory = host.get("Memory") or 0
    if not memory:
        out.append(
            Finding("SBX-C014", "medium", "no memory limit", "HostConfig.Memory is 0", "set docker.memory", t, "5.10")
        )
    elif (host.get("MemorySwap") or 0) not in (memory,):
        out.append(
            Finding(
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
            Finding(
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
            Finding("SBX-C017", "medium", "no pids limit", f"PidsLimit is {pids}", "set docker.pids_limit", t, "5.28")
        )
    return out


def filesystem(doc: Doc, t: str) -> list[Finding]:
    host = host_config(doc)
    out = []
    if not host.get("ReadonlyRootfs"):
        out.append(
            Finding(
                "SBX-C018",
                "medium",
                "root filesystem writable",
                "ReadonlyRootfs is false",
                "keep docker.read_only_root: true",
                t,
                "5.12",
            )
        )
    unsized = [p for p, o in (host.get("Tmpfs") or {}).items() if "size=" not in str(o)]
    if unsized:
        out.append(
            Finding(
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
            Finding(
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
            Finding(
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
            Finding(
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
    host = host_config(doc)
    out = []
    for port, bindings in (host.get("PortBindings") or {}).items():
        for b in bindings or []:
            ip = b.get("HostIp") or "0.0.0.0"  # noqa: S104 - describing, not binding
            hport = int(b.get("HostPort") or 0)
            if ip in ("0.0.0.0", "::", ""):  # noqa: S104
                out.append(
                    Finding(
                        "SBX-C023",
                        "high",
                        "port published on all interfaces",
                        f"{port} -> {ip}:{hport or 'random'}",
                        "publish on 127.0.0.1 only",
                        t,
                        "5.13",
                    )
                )
            elif 0 < hport < 1024:
                out.append(
                    Finding(
                        "SBX-C024",
                        "medium",
                        "privileged host port",
                        f"{port} -> {ip}:{hport}",
                        "use a host port >= 1024",
                        t,
                        "5.7",
                    )
                )
            else:
                out.append(
                    Finding(
                        "SBX-C025",
                        "info",
                        "port published on loopback",
                        f"{port} -> {ip}:{hport or 'random'}",
                        "expected only for the browser's CDP port",
                        t,
                        "5.8",
                    )
                )
    restart = (host.get("RestartPolicy") or {}).get("Name") or "no"
    if restart not in ("no", ""):
        out.append(
            Finding(
                "SBX-C026",
                "low",
                "restart policy set",
                f"RestartPolicy is {restart}",
                "sandboxes are recreated on demand; use no",
                t,
                "5.14",
            )
        )
    user = str((doc.get("Config") or {}).get("User") or "")
    # `00`, `+0`, `-0` and `0000:0000` are uid 0 to the engine too
    if is_root_user(user) and str(host.get("UsernsMode") or "") != "private":
        out.append(
            Finding(
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
