"""One session's processes hidden from another's in a shared container: `/proc` with hidepid.

Sessions sharing an agent- or shared-scope container run as uids of their own (session users),
but the kernel still lets any uid list `/proc` and read every process's `cmdline`: one session
would see the command lines (arguments, a password on a command line) of the others. Mounted with
`hidepid=invisible`, a container's procfs shows each uid only its own processes: the other
sessions' pids are not listed and cannot be opened, `ps` sees nothing of them.

The sandbox itself can never do this (no capabilities, no `mount` in the seccomp profile), and
a privileged `docker exec` cannot either (the container's seccomp profile applies to every exec
in it, and this engine refuses privileged execs into a container whose capabilities were
dropped). The orchestrator does it from the host, where it runs as root: `fspick` opens the
container's own procfs instance through `/proc/<pid>/root/proc` and `fsconfig` sets the option on
that instance only (per-instance procfs options since Linux 5.8: the host's `/proc` and every
other container's are untouched). Nothing of the container is executed, and the mount's own
flags (nosuid, nodev, noexec) are kept: only the superblock option changes.

Where the orchestrator cannot reach the container's procfs (gVisor's runsc, whose `/proc` is its
own and has no hidepid; an engine on another host or in another pid namespace, e.g. the compose
service without the host's pid namespace; not root), the sandbox is still made and the gap is
reported: a `sandbox_processes_visible` warning and `sandbox doctor`'s "process hiding" line.
Where it can and the option still does not hold, the sandbox is refused (fail closed).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from sandbox._log import logger
from sandbox.config.merge import agent_ids, effective_agent
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.bounded import remember
from sandbox.runtime.docker.kill import in_container
from sandbox.runtime.naming import Labels

HIDDEN = ("invisible", "2")  # how the kernel shows the option (named since 5.8, a number before)
# the new mount API's numbers are the same on every architecture that has it (Linux 5.2+)
SYS_FSCONFIG, SYS_FSPICK = 431, 433
ARCHES = frozenset({"x86_64", "aarch64"})
FSPICK_FLAGS = 0x1 | 0x2 | 0x4  # CLOEXEC, SYMLINK_NOFOLLOW, NO_AUTOMOUNT
FSCONFIG_SET_STRING, FSCONFIG_CMD_RECONFIGURE = 1, 7
AT_FDCWD = -100
_warned: OrderedDict[str, None] = OrderedDict()  # containers warned about (bounded: a repeat is one more log line)


@dataclass(frozen=True)
class Hiding:
    """Whether a container's processes are hidden per uid, and if not, why not."""

    applied: bool
    reason: str = ""


def wanted(spec: Any) -> bool:
    """Whether the sandbox needs it: sessions with uids of their own share it."""
    return bool(spec.session_users)


def proc_options(pid: int) -> str | None:
    """The superblock options of the `/proc` mount in `pid`'s mount namespace, None when none is there."""
    with open(f"/proc/{pid}/mountinfo") as table:
        return options_of_proc(table.read())


def options_of_proc(mountinfo: str) -> str | None:
    """The superblock options of the procfs mounted at `/proc` in a mount table (the top one)."""
    found = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5 or fields[4] != "/proc":
            continue
        fstype, _, options = [*line.split(" - ", 1)[1].split(" ", 2), "", ""][:3]
        if fstype == "proc":
            found = options.strip()  # the last one listed is the one on top
    return found


def is_hidden(options: str) -> bool:
    """Whether procfs options hide other uids' processes."""
    return any(f"hidepid={value}" in options.split(",") for value in HIDDEN)


def apply(pid: int, container_id: str) -> Hiding:
    """Set hidepid on the procfs of the container whose process `pid` is (on this host).

    Returns what happened: applied, or not applicable here and why (the caller reports it).

    Raises:
        SandboxUnavailable: the container's procfs was reachable, but the option could not be set
            or does not show afterwards (fail closed: the sandbox must not be used as it is).
    """
    if platform.machine() not in ARCHES:
        return Hiding(False, f"no hidepid support for {platform.machine()} here")
    if pid <= 1 or not in_container(pid, container_id):
        return Hiding(False, "the orchestrator cannot see the container's processes (another host or pid namespace)")
    try:
        before = proc_options(pid)
    except PermissionError:
        return Hiding(False, "the orchestrator may not read the container's mounts (it is not root)")
    except OSError as exc:
        return Hiding(False, f"the container's mounts cannot be read: {exc.strerror}")
    if before is None:
        # gVisor (runsc) and VM runtimes: the container's /proc is not the host kernel's
        return Hiding(False, "the container's /proc is not a host kernel procfs (gVisor has no hidepid)")
    if is_hidden(before):
        return Hiding(True)
    if not _own_procfs(pid):
        # a runtime whose State.Pid lives in the host's mount namespace (a VM shim): its /proc is
        # the host's, and hidepid there would hide the host's processes from its own users
        return Hiding(False, "the container's /proc is the orchestrator's own (a VM runtime's shim pid)")
    try:
        _reconfigure(f"/proc/{pid}/root/proc")
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM, errno.EACCES):
            return Hiding(False, f"the container's procfs cannot be reconfigured from here: {exc.strerror}")
        raise SandboxUnavailable(f"could not hide other sessions' processes (hidepid on /proc): {exc}") from exc
    after = proc_options(pid)
    if after is None or not is_hidden(after):
        raise SandboxUnavailable(f"hidepid did not take on the container's /proc (its options: {after})")
    return Hiding(True)


def _own_procfs(pid: int) -> bool:
    """Whether `pid` has a mount namespace and a procfs of its own, not this process's."""
    try:
        other_ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino
        other_proc = os.stat(f"/proc/{pid}/root/proc").st_dev != os.stat("/proc").st_dev
    except OSError:
        return False
    return other_ns and other_proc


@cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _reconfigure(path: str) -> None:
    """fspick + fsconfig(hidepid) + reconfigure: the superblock's option only, never the mount's flags."""
    libc = _libc()
    fd = libc.syscall(SYS_FSPICK, AT_FDCWD, path.encode(), FSPICK_FLAGS)
    if fd < 0:
        raise _errno("fspick")
    try:
        for value in HIDDEN:  # "invisible" since 5.8; a kernel before it knows only the number
            if libc.syscall(SYS_FSCONFIG, fd, FSCONFIG_SET_STRING, b"hidepid", value.encode(), 0) == 0:
                break
            if ctypes.get_errno() != errno.EINVAL:
                raise _errno("fsconfig hidepid")
        else:
            raise _errno("fsconfig hidepid")
        if libc.syscall(SYS_FSCONFIG, fd, FSCONFIG_CMD_RECONFIGURE, None, None, 0) != 0:
            raise _errno("fsconfig reconfigure")
    finally:
        os.close(fd)


def _errno(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def hide_in(attrs: dict[str, Any], spec: Any) -> Hiding | None:
    """Apply to a container as the engine describes it (inspect's attrs); None when not wanted.

    Idempotent and cheap when already applied (one read of its mount table): also run when a
    running container is adopted, so one made before this existed, or restarted, is covered too.
    """
    if not wanted(spec):
        return None
    hiding = apply(int((attrs.get("State") or {}).get("Pid") or 0), str(attrs["Id"]))
    if not hiding.applied and attrs["Id"] not in _warned:
        remember(_warned, attrs["Id"], None)
        logger.bind(container=spec.name, reason=hiding.reason).warning("sandbox_processes_visible")
    return hiding


async def hide_processes(backend: Any, container_id: str, spec: Any) -> Hiding | None:
    """Apply to a container that just started, before any session uses it (fail closed).

    Raises:
        SandboxUnavailable: see :func:`apply`.
    """
    if not wanted(spec):
        return None
    attrs = await backend.call("inspect sandbox", backend.client.api.inspect_container, container_id)
    return hide_in(attrs, spec)


def shared_runtimes(config: Any) -> set[str]:
    """The runtimes of configured agents whose sessions may share a container ("" is the default)."""
    found = set()
    for agent_id in agent_ids(config):
        sandbox = effective_agent(config, agent_id).sandbox
        if sandbox.mode != "off" and sandbox.scope != "session" and sandbox.session_users != "off":
            found.add(sandbox.docker.runtime or "")
    return found


def probe(
    client: Any, image: str, runtimes: set[str] | None = None
) -> tuple[Literal["ok", "warn", "fail"], str, str, str]:
    """`sandbox doctor`'s line: can this orchestrator hide sessions' processes from each other?

    Starts a throwaway container (the engine's default runtime) and applies hidepid to it;
    `runtimes` (of agents whose sessions share containers) other than runc are named as gaps.
    Returns (status, name, detail, fix).
    """
    name = "process hiding"
    others = sorted(r for r in runtimes or () if r not in ("", "runc", "io.containerd.runc.v2"))
    if others:
        return (
            "warn",
            name,
            f"sessions sharing a container on {', '.join(others)} can read each other's command lines "
            "(gVisor's /proc has no hidepid)",
            "use scope: session for those agents where sessions must not see each other's processes",
        )
    container = None
    try:
        container = client.containers.run(
            image,
            ["sleep", "60"],
            detach=True,
            network_mode="none",
            user="1000:1000",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            labels={Labels.MANAGED: "probe"},
        )
        container.reload()
        hiding = apply(int(container.attrs["State"]["Pid"]), container.id)
    except (SandboxUnavailable, OSError) as exc:
        return ("fail", name, f"hidepid could not be set on a container's /proc: {exc}", "a kernel of 5.8 or later")
    except Exception as exc:  # the engine's own refusal: the other checks say more
        return ("warn", name, f"probe container failed: {exc.__class__.__name__}: {exc}", "")
    finally:
        if container is not None:
            with contextlib.suppress(Exception):
                container.remove(force=True)
    if hiding.applied:
        return ("ok", name, "sessions sharing a container see only their own processes (hidepid on its /proc)", "")
    return (
        "warn",
        name,
        f"sessions sharing a container can read each other's command lines: {hiding.reason}",
        "run the orchestrator as root on the engine's host "
        "(compose.yaml's service has pid: host, SYS_ADMIN and SYS_PTRACE for it), "
        "or use scope: session where sessions must not see each other's processes",
    )
