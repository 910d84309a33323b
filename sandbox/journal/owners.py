"""Who runs a call: the owner identity of an orchestrator process, and whether it is alive.

Recovery must settle only the calls of orchestrators that are gone: two processes on one state
dir (two CLI calls, the CLI beside a service) would otherwise kill each other's running
commands. An owner is `<host>@<pid namespace>|<boot id>|<pid>|<process start time>`: on the same
host, boot and pid namespace the kernel answers (the pid runs and started at that time, so a
reused pid is not mistaken for it); elsewhere the owner's lease in the journal does (renewed
while it has calls open).
"""

from __future__ import annotations

import os
import socket
from functools import cache

LEASE_S = 60.0  # an owner on another host is alive while its lease is younger than this


@cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown-boot"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None  # a zombie has finished
    return fields[19].decode()


@cache
def _host() -> str:
    """This host as an owner names it: its name and this process's pid namespace. A service in a
    container on the host's network (compose) has the host's name and boot but pids of its own,
    so the kernel here can say nothing of its pids."""
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = "?"
    return f"{socket.gethostname()}@{namespace}"


_owner: tuple[int, str] | None = None


def current_owner() -> str:
    """This process's owner identity (computed again after a fork)."""
    global _owner
    pid = os.getpid()
    if _owner is None or _owner[0] != pid:
        _owner = (pid, f"{_host()}|{_boot_id()}|{pid}|{_start_time(pid) or '?'}")
    return _owner[1]


def owner_here(owner: str) -> bool:
    """Whether `owner` ran on this host since its last boot, in this pid namespace, with a known
    start time (so the kernel can say whether it runs)."""
    parts = owner.split("|")
    return len(parts) == 4 and parts[0] == _host() and parts[1] == _boot_id() and parts[3] != "?"


def owner_alive(owner: str, lease_until: float | None, now: float) -> bool:
    """Whether the orchestrator that wrote `owner` still runs.

    Same host, boot and pid namespace: the kernel says (pid present with the same start time).
    Otherwise (another host, a container with pids of its own, an unknown start time): the lease.
    An owner of an older journal (empty) is gone.
    """
    parts = owner.split("|")
    if len(parts) != 4:
        return False
    pid, start = parts[2], parts[3]
    if owner_here(owner):
        return pid.isdigit() and _start_time(int(pid)) == start
    return lease_until is not None and lease_until > now
