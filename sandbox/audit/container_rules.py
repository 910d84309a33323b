"""Rules over one container's `docker inspect` document (live, or built from the config).

Each rule returns findings; a rule that finds nothing returns []. The same rules run on the
config (through `config_docs.inspect_of`) and on live containers, so both say the same thing.
This module holds the privilege and namespace rules and runs them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sandbox.audit.exposure_rules import env_secrets, network_egress
from sandbox.audit.findings import Finding
from sandbox.audit.mount_rules import mounts
from sandbox.audit.resource_rules import filesystem, limits, ports_restart_user
from sandbox.audit.rule_helpers import Doc, host_config
from sandbox.audit.spellings import denies_unix_sockets, seccomp_weakness

ALLOWED_CAP_ADD = frozenset({"NET_BIND_SERVICE", "CAP_NET_BIND_SERVICE"})


def privileged(doc: Doc, t: str) -> list[Finding]:
    if host_config(doc).get("Privileged"):
        return [
            Finding(
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
    host = host_config(doc)
    out = []
    drops = [c.upper().removeprefix("CAP_") for c in host.get("CapDrop") or []]
    if "ALL" not in drops:
        out.append(
            Finding(
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
            Finding(
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
    opts = [str(o) for o in host_config(doc).get("SecurityOpt") or []]
    out = []
    if not any(o.replace("=", ":") in ("no-new-privileges:true", "no-new-privileges") for o in opts):
        out.append(
            Finding(
                "SBX-C004",
                "high",
                "no-new-privileges not set",
                f"SecurityOpt is {opts or 'empty'}",
                "keep docker.no_new_privileges: true",
                t,
                "5.25",
            )
        )
    # judged by content: a profile allowing every syscall by default is unconfined, however named
    for weakness in filter(None, (seccomp_weakness(o[8:]) for o in opts if o[:8] in ("seccomp=", "seccomp:"))):
        out.append(
            Finding(
                "SBX-C005",
                "high",
                "seccomp unconfined",
                weakness,
                "remove docker.seccomp_profile (the engine's default profile denies by default), or use a "
                "profile whose defaultAction is SCMP_ACT_ERRNO",
                t,
                "5.21",
            )
        )
    if (doc.get("Mounts") or host_config(doc).get("Binds")) and not denies_unix_sockets(opts):
        # a socket that appears below a mount after the sandbox started is reachable through it
        out.append(
            Finding(
                "SBX-C030",
                "low",
                "Unix sockets allowed in a sandbox with host mounts",
                "the seccomp profile allows socket(AF_UNIX): a socket created below a mount after "
                "the sandbox started (a dev database in the workspace) is reachable",
                "keep docker.seccomp_profile: strict (the default)",
                t,
                "",
            )
        )
    if any(o.replace(":", "=") == "apparmor=unconfined" for o in opts):
        out.append(
            Finding(
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
            Finding(
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
    host = host_config(doc)
    out = []
    net = str(host.get("NetworkMode") or "")
    if net == "host":
        out.append(
            Finding(
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
            Finding(
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
        mode = str(host.get(key) or "")
        if mode == "host":
            out.append(
                Finding(
                    rule,
                    "critical" if key == "PidMode" else "high",
                    f"host {key[:-4].upper()} namespace",
                    f"{key} is host",
                    f"do not share the host's {key[:-4]} namespace",
                    t,
                    cis,
                )
            )
        elif mode.startswith("container:"):
            # another container's processes (their /proc/*/environ) or shared memory are in reach
            out.append(
                Finding(
                    rule,
                    "high",
                    f"joins another container's {key[:-4].upper()} namespace",
                    f"{key} is {mode}",
                    f"give the sandbox its own {key[:-4]} namespace",
                    t,
                    cis,
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
    network_egress,
    env_secrets,
)


def audit_container(doc: Doc, target: str, scratch_roots: Sequence[str] = ()) -> list[Finding]:
    """Every container rule over one inspect document."""
    found = [finding for rule in CONTAINER_RULES for finding in rule(doc, target)]
    return found + mounts(doc, target, scratch_roots)
