"""A Pod Security Standards checker (`baseline` and `restricted`) for the Pods this project renders.

Admission on a real cluster has the last word; this checker is what can run here, with no API
server: every Pod (and Pod template) `sandbox k8s render` / `k8s pod` prints passes it, and a
test feeds it one failing fixture per rule. Each rule names the upstream check it encodes
(k8s.io/pod-security-admission, package policy, file `check_<id>.go`) and the first version of
the standards that has it (read at pod-security-admission 8f84a87c, cross-checked at the 1.33-1.36
tags); a rule applies when the pinned version is at or after that, in the form of that version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# baseline's allowed capabilities to add (check_capabilities_baseline.go)
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# check_sysctls.go: the safe set, grown over versions
SAFE_SYSCTLS = {
    (1, 0): {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
    },
    (1, 27): {"net.ipv4.ip_local_reserved_ports"},
    (1, 29): {
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    },
    (1, 32): {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"},
    (1, 37): {"net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"},
}
# check_restrictedVolumes.go
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
SELINUX_TYPES_1_31 = frozenset({"container_engine_t"})  # added to the allowed types in 1.31


@dataclass(frozen=True)
class Rule:
    """One check of the standards: its upstream id, level, first version, and what it finds."""

    id: str
    level: str  # baseline | restricted
    since: tuple[int, int]
    check: Callable[[dict[str, Any], tuple[int, int]], list[str]]
    overrides: str | None = None  # the baseline check this restricted one replaces


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(field) or []:
            yield f"{field}[{container.get('name', '?')}]", container


def _sc(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def _windows(spec: dict[str, Any], version: tuple[int, int]) -> bool:
    # from 1.25 the Linux-only restricted checks skip Pods that declare a Windows OS
    return version >= (1, 25) and (spec.get("os") or {}).get("name") == "windows"


def _own_user_namespace(spec: dict[str, Any], version: tuple[int, int]) -> bool:
    # from 1.35 a Pod in its own user namespace (`hostUsers: false`) is exempt from the root checks
    return version >= (1, 35) and spec.get("hostUsers") is False


def _contexts(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [("securityContext", spec.get("securityContext") or {})] + [(w, _sc(c)) for w, c in _containers(spec)]


def _host_process(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    found = []
    if ((spec.get("securityContext") or {}).get("windowsOptions") or {}).get("hostProcess"):
        found.append("securityContext.windowsOptions.hostProcess=true")
    found += [
        f"{w}.windowsOptions.hostProcess=true"
        for w, c in _containers(spec)
        if (_sc(c).get("windowsOptions") or {}).get("hostProcess")
    ]
    return found


def _host_namespaces(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    return [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]


def _privileged(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    return [f"{w}.privileged=true" for w, c in _containers(spec) if _sc(c).get("privileged")]


def _capabilities_baseline(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    found = []
    for where, container in _containers(spec):
        added = set((_sc(container).get("capabilities") or {}).get("add") or [])
        if extra := sorted(added - BASELINE_CAPABILITIES):
            found.append(f"{where}.capabilities.add={extra}")
    return found


def _host_path_volumes(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    return [f"volumes[{v.get('name')}].hostPath" for v in spec.get("volumes") or [] if "hostPath" in v]


def _host_ports(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    return [
        f"{w}.ports.hostPort={p['hostPort']}"
        for w, c in _containers(spec)
        for p in c.get("ports") or []
        if p.get("hostPort")
    ]


def _app_armor(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    found = []
    for where, sc in _contexts(spec):
        kind = (sc.get("appArmorProfile") or {}).get("type")
        if kind is not None and kind not in ("RuntimeDefault", "Localhost"):
            found.append(f"{where}.appArmorProfile.type={kind}")
    for key, value in (spec.get(ANNOTATIONS) or {}).items():
        allowed = value in ("", "runtime/default") or value.startswith("localhost/")
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not allowed:
            found.append(f"annotation {key}={value}")
    return found


def _se_linux(spec: dict[str, Any], version: tuple[int, int]) -> list[str]:
    allowed = SELINUX_TYPES | (SELINUX_TYPES_1_31 if version >= (1, 31) else frozenset())
    found = []
    for where, sc in _contexts(spec):
        options = sc.get("seLinuxOptions") or {}
        if options.get("type", "") not in allowed:
            found.append(f"{where}.seLinuxOptions.type={options['type']}")
        found += [f"{where}.seLinuxOptions.{k}={options[k]}" for k in ("user", "role") if options.get(k)]
    return found


def _proc_mount(spec: dict[str, Any], version: tuple[int, int]) -> list[str]:
    if _own_user_namespace(spec, version):
        return []
    return _proc_mount_restricted(spec, version)


def _proc_mount_restricted(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    return [
        f"{w}.procMount={_sc(c)['procMount']}"
        for w, c in _containers(spec)
        if _sc(c).get("procMount", "Default") != "Default"
    ]


def _host_probes(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    found = []
    for where, container in _containers(spec):
        handlers = [(p, container.get(p) or {}) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        lifecycle = container.get("lifecycle") or {}
        handlers += [(f"lifecycle.{h}", lifecycle.get(h) or {}) for h in ("postStart", "preStop")]
        for name, handler in handlers:
            for kind in ("httpGet", "tcpSocket"):
                if (handler.get(kind) or {}).get("host"):
                    found.append(f"{where}.{name}.{kind}.host={handler[kind]['host']}")
    return found


def _seccomp_baseline(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    found = [
        f"{w}.seccompProfile.type=Unconfined"
        for w, sc in _contexts(spec)
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined"
    ]
    prefixes = ("seccomp.security.alpha.kubernetes.io/pod", "container.seccomp.security.alpha.kubernetes.io/")
    for key, value in (spec.get(ANNOTATIONS) or {}).items():
        allowed = value in ("runtime/default", "docker/default") or value.startswith("localhost/")
        if key.startswith(prefixes) and not allowed:
            found.append(f"annotation {key}={value}")
    return found


def _sysctls(spec: dict[str, Any], version: tuple[int, int]) -> list[str]:
    safe = set().union(*(names for since, names in SAFE_SYSCTLS.items() if version >= since))
    return [
        f"sysctls[{s['name']}]"
        for s in (spec.get("securityContext") or {}).get("sysctls") or []
        if s.get("name") not in safe
    ]


def _restricted_volumes(spec: dict[str, Any], _v: tuple[int, int]) -> list[str]:
    found = []
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volumes[{volume.get('name')}]: {sorted(kinds - RESTRICTED_VOLUMES)}")
    return found


def _allow_privilege_escalation(spec: dict[str, Any], version: tuple[int, int]) -> list[str]:
    if _windows(spec, version):
        return []
    return [
        f"{w}.allowPrivilegeEscalation is not false"
        for w, c in _containers(spec)
        if _sc(c).get("allowPrivilegeEscalation") is not False
    ]


def _run_as_non_root(spec: dict[str, Any], version: tuple[int, int]) -> list[str]:
    if _own_user_namespace(spec, version):
        return []
    pod = (spec.get("securityContext") or {}).get("runAsNonRoot")
    found = ["securityContext.runAsNonRoot=false"] if pod is False else []
    for where, container in _containers(spec):
        own = _sc(container).get("runAsNonRoot")
        if own is False:
            found.append(f"{where}.runAsNonRoot=false")
        elif own is None and pod is not True:
            found.append(f"{where}: runAsNonRoot unset (and not set on the Pod)")
    return found


def _run_as_user(spec: dict[str, Any], version: tuple[int, int]) -> list[str]:
    if _own_user_namespace(spec, version):
        return []
    return [f"{w}.runAsUser=0" for w, sc in _contexts(spec) if sc.get("runAsUser") == 0]


def _seccomp_restricted(spec: dict[str, Any], version: tuple[int, int]) -> list[str]:
    if _windows(spec, version):
        return []
    pod = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    ok = ("RuntimeDefault", "Localhost")
    found = [f"securityContext.seccompProfile.type={pod}"] if pod is not None and pod not in ok else []
    for where, container in _containers(spec):
        own = (_sc(container).get("seccompProfile") or {}).get("type")
        if own is not None and own not in ok:
            found.append(f"{where}.seccompProfile.type={own}")
        elif own is None and pod is None:
            found.append(f"{where}: seccompProfile unset (and not set on the Pod)")
    return found


def _capabilities_restricted(spec: dict[str, Any], version: tuple[int, int]) -> list[str]:
    if _windows(spec, version):
        return []
    found = []
    for where, container in _containers(spec):
        caps = _sc(container).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"{where}.capabilities.drop does not hold ALL")
        if extra := sorted(set(caps.get("add") or []) - {"NET_BIND_SERVICE"}):
            found.append(f"{where}.capabilities.add={extra}")
    return found


RULES = (
    Rule("windowsHostProcess", "baseline", (1, 0), _host_process),
    Rule("hostNamespaces", "baseline", (1, 0), _host_namespaces),
    Rule("privileged", "baseline", (1, 0), _privileged),
    Rule("capabilities_baseline", "baseline", (1, 0), _capabilities_baseline),
    Rule("hostPathVolumes", "baseline", (1, 0), _host_path_volumes),
    Rule("hostPorts", "baseline", (1, 0), _host_ports),
    Rule("hostProbesAndHostLifecycle", "baseline", (1, 34), _host_probes),
    Rule("appArmorProfile", "baseline", (1, 0), _app_armor),
    Rule("seLinuxOptions", "baseline", (1, 0), _se_linux),
    Rule("procMount", "baseline", (1, 0), _proc_mount),
    Rule("seccompProfile_baseline", "baseline", (1, 0), _seccomp_baseline),
    Rule("sysctls", "baseline", (1, 0), _sysctls),
    Rule("restrictedVolumes", "restricted", (1, 0), _restricted_volumes, overrides="hostPathVolumes"),
    Rule("allowPrivilegeEscalation", "restricted", (1, 8), _allow_privilege_escalation),
    Rule("runAsNonRoot", "restricted", (1, 0), _run_as_non_root),
    Rule("runAsUser", "restricted", (1, 23), _run_as_user),
    Rule("seccompProfile_restricted", "restricted", (1, 19), _seccomp_restricted, overrides="seccompProfile_baseline"),
    Rule("capabilities_restricted", "restricted", (1, 22), _capabilities_restricted, overrides="capabilities_baseline"),
    Rule("procMount_restricted", "restricted", (1, 35), _proc_mount_restricted, overrides="procMount"),
)
ANNOTATIONS = "__annotations__"  # where violations() hands a check the object's annotations


def parse_version(text: str) -> tuple[int, int]:
    """`v1.33` -> (1, 33)."""
    major, minor = text.removeprefix("v").split(".")
    return int(major), int(minor)


def pod_spec_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The Pod spec inside a Pod or a workload's template (Deployment, ...), or None."""
    if obj.get("kind") == "Pod":
        return dict(obj.get("spec") or {})
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict):
        return dict(template.get("spec") or {})
    return None


def violations(obj: dict[str, Any], level: str = "restricted", version: str = "v1.33") -> list[str]:
    """Every `rule: where` the object's Pod spec breaks at `level` and `version` (empty: it passes).

    `restricted` is every `baseline` rule, less those a restricted rule in force overrides, plus
    the restricted rules, as pod-security-admission's registry composes them.
    """
    spec = pod_spec_of(obj)
    if spec is None:
        return []
    if obj.get("kind") == "Pod":
        spec[ANNOTATIONS] = (obj.get("metadata") or {}).get("annotations") or {}
    else:
        template = (obj.get("spec") or {}).get("template") or {}
        spec[ANNOTATIONS] = (template.get("metadata") or {}).get("annotations") or {}
    at = parse_version(version)
    levels = {"baseline"} if level == "baseline" else {"baseline", "restricted"}
    in_force = [r for r in RULES if r.level in levels and at >= r.since]
    overridden = {r.overrides for r in in_force if r.overrides}
    found: list[str] = []
    for rule in in_force:
        if rule.id not in overridden:
            found += [f"{rule.id}: {problem}" for problem in rule.check(spec, at)]
    return found
