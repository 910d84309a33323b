"""Finding and signalling a call's processes through /proc, with no new process and no shell.

A process of a call carries `SBX_CALL=<id>` in its environment; a process in the same process
group as a tagged one belongs to the call too (it may have changed its environment). Used on
the host (runtime/host/: mode off and the host backend) for every kill, and for sandboxes whose
engine runs on this host (see runtime/docker/kill.py): reading /proc is a few hundred
microseconds where a shell scanning it forks once per process. Both backend folders import it
from here, so neither imports the other.
"""

from __future__ import annotations

import os
import signal as signals
from collections.abc import Iterable
from dataclasses import dataclass

from sandbox.runtime.shellwrap import TAG_VAR


@dataclass(frozen=True)
class Members:
    """Host pids of a call's processes, or `visible=False` when the host cannot see them."""

    pids: tuple[int, ...]
    visible: bool = True
    # process groups a tagged member leads or belongs to: signalled whole, in one kernel step,
    # so a fork bomb cannot add members between the listing and the kill
    groups: tuple[int, ...] = ()


def tagged(pid: int, tag: bytes) -> tuple[bool, int | None] | None:
    # (carries the tag, process group) of a host pid; None when it is gone
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    threads = int(fields[17]) if len(fields) > 17 else 1
    if not fields or _dead(fields[0].decode(), threads):
        return None
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except (FileNotFoundError, ProcessLookupError):
        env = b""  # gone, or a leader that exited while its threads run (see below)
    except PermissionError:
        if threads <= 1:
            raise
        env = b""  # an exited leader refuses even its own user: its threads answer
    if not env and threads > 1:  # the exited leader shows no environment: a live thread does
        env = _thread_environ(pid)
    pgrp = int(fields[2]) if len(fields) > 2 else None
    return tag in env.split(b"\0"), pgrp


def _thread_environ(pid: int) -> bytes:
    """The environment as a live thread of `pid` shows it (b"" when none does).

    Raises:
        PermissionError: no thread's could be read, and one refused (not ours to read).
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return b""
    refused = False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/environ", "rb") as f:
                env = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        except PermissionError:
            refused = True
            continue
        if env:
            return env
    if refused:
        raise PermissionError(f"no thread of {pid} lets its environment be read")
    return b""


def members_of(pids: Iterable[int], call_id: str, *, skip_unreadable: bool = False) -> Members:
    """Which of `pids` belong to `call_id`: tagged, or in a tagged process's group.

    The caller's own process and process group are never members (a kill must not reach us).

    Raises:
        PermissionError: a process's environment cannot be read (not root, not its owner),
            unless `skip_unreadable` (on the host, the call's processes are ours to read).
    """
    tag = f"{TAG_VAR}={call_id}".encode()
    info: dict[int, tuple[bool, int | None]] = {}
    me, my_group = os.getpid(), os.getpgrp()
    for pid in pids:
        if pid == me:
            continue
        try:
            found = tagged(pid, tag)
        except PermissionError:
            if skip_unreadable:
                continue
            raise
        if found is not None:
            info[pid] = found
    groups = {pgrp for is_tagged, pgrp in info.values() if is_tagged and pgrp and pgrp != my_group}
    members = tuple(pid for pid, (is_tagged, pgrp) in info.items() if is_tagged or pgrp in groups)
    return Members(members, groups=tuple(sorted(g for g in groups if g > 1)))


def host_uid(pid: int, uid: int) -> int | None:
    """The host's number for `uid` as the process `pid` sees it (its user namespace's map, so
    an engine with userns-remap is read right); None when `pid` is gone or `uid` is not mapped."""
    try:
        with open(f"/proc/{pid}/uid_map") as f:
            return mapped_uid(f.read(), uid)
    except (FileNotFoundError, ProcessLookupError):
        return None


def mapped_uid(uid_map: str, uid: int) -> int | None:
    """`uid` through a uid_map's lines (`inside outside count`); None when no line maps it."""
    for line in uid_map.splitlines():
        inside, outside, count = (int(n) for n in line.split())
        if inside <= uid < inside + count:
            return outside + uid - inside
    return None


def owned_by(pids: Iterable[int], uid: int) -> Members:
    """Which of `pids` run as the host uid `uid` (real, effective or saved: a process that
    changed one of them is still the user's). The caller's own process is never one."""
    me = os.getpid()
    found = []
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if runs_as(status, uid):
            found.append(pid)
    return Members(tuple(found))


def runs_as(status: str, uid: int) -> bool:
    """Whether a /proc status text is a live process (not a zombie: it is dead already, its
    parent reaps it) whose real, effective or saved uid is `uid` (the host's number)."""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    threads = int(fields.get("Threads", "1").strip() or 1)
    if _dead(fields.get("State", "").strip()[:1], threads):
        return False
    return str(uid) in fields.get("Uid", "").split()[:3]


def _dead(state: str, threads: int) -> bool:
    """Whether a process in `state` (/proc's letter) with `threads` is over: a zombie is (its
    parent, the init, reaps it), but a leader that exited while its other threads run shows Z
    too, and is alive."""
    return state in ("Z", "X") and threads <= 1


def all_pids() -> list[int]:
    """Every pid this process can see."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def signal_members(members: Members, signal: str) -> bool:
    """Send `signal` (TERM, KILL, INT, HUP) to every member; False when one was not ours to
    signal (a non-root orchestrator: the kernel said EPERM)."""
    number = getattr(signals, f"SIG{signal}")
    permitted = True
    for send, target in [(os.killpg, g) for g in members.groups] + [(os.kill, p) for p in members.pids]:
        try:
            send(target, number)
        except ProcessLookupError:
            pass
        except PermissionError:
            permitted = False
    return permitted
