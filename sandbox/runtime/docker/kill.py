"""Killing a call's processes from outside the container, without a new process in it.

The in-container kill (shellwrap) needs to fork, and a sandbox that used up its pids limit (a
fork bomb) cannot. When the engine runs on this host, the engine's `top` lists the container's
processes by host pid; their environment (`SBX_CALL=<id>`) and process group say which belong
to the call, and the orchestrator signals them directly. A round that leaves any alive is
repeated with the container frozen (the cgroup freezer, `docker pause`) so nothing can fork
between the listing and the signal. When the processes are not visible from here (a remote
engine, another pid namespace, no permission), callers fall back to the in-container kill.
"""

from __future__ import annotations

import contextlib
import os
import signal as signals
import time
from collections.abc import Callable
from typing import Any

import docker.errors

from sandbox.runtime.proc_kill import Members, host_uid, members_of, owned_by, runs_as, signal_members

ROUNDS = 6  # waits 0.05 s, 0.1 s, ... 1.6 s between rounds: about 3 s in all


def container_pids(api: Any, container_id: str) -> list[int] | None:
    """Host pids of every process in the container; [] when it is gone; None when not visible here."""
    try:
        top = api.top(container_id)
    except docker.errors.NotFound:
        return []
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # not running: nothing left to kill
            return []
        return None
    titles = top.get("Titles") or []
    if "PID" not in titles:
        return None
    column = titles.index("PID")
    pids = [int(row[column]) for row in top.get("Processes") or [] if row[column].isdigit()]
    if pids and not any(os.path.exists(f"/proc/{pid}") for pid in pids):
        return None  # the engine is on another host (or in another pid namespace)
    return pids


def _listed(api: Any, container_id: str, select: Callable[[list[int]], Members]) -> Members:
    """`select` among the container's processes (only pids the engine listed for this container
    are ever signalled); not visible when the host cannot see or read them."""
    pids = container_pids(api, container_id)
    if pids is None:
        return Members((), visible=False)
    try:
        return select(pids)
    except PermissionError:
        return Members((), visible=False)


def call_members(api: Any, container_id: str, call_id: str) -> Members:
    """The container's processes that belong to `call_id`: tagged, or in a tagged process's group."""
    return _listed(api, container_id, lambda pids: members_of(pids, call_id))


def kill_call(api: Any, container_id: str, call_id: str, signal: str) -> bool | None:
    """Signal a call's processes from the host until none is left (for KILL).

    Returns True when the kill is confirmed (nothing of the call is left), False when something
    survived every round, None when the processes are not visible from this host.
    """
    return _signal_until_gone(api, container_id, lambda: call_members(api, container_id, call_id), signal)


def kill_user(api: Any, container_id: str, uid: int) -> bool | None:
    """KILL every process of `uid` (the container's number) in the container from the host until
    none is left (a closed session's, with session users). Returns as :func:`kill_call` does (None
    also when this process may not signal them: a non-root orchestrator)."""
    if uid == 0:
        return False  # never the container's root: its init and keep-alive are not a session's
    pids = container_pids(api, container_id)
    if not pids:
        return None if pids is None else True  # an empty container: nothing of it is left
    try:
        # as the host numbers it (the same unless the engine remaps users), once for the kill
        mapped = next((m for m in (host_uid(pid, uid) for pid in pids) if m is not None), None)
    except PermissionError:
        return None
    if mapped is None:
        return None
    return _signal_until_gone(
        api,
        container_id,
        lambda: _listed(api, container_id, lambda listed: owned_by(listed, mapped)),
        "KILL",
        send=lambda members, _: _kill_checked(members, container_id, mapped),
    )


def _kill_checked(members: Members, container_id: str, host_uid_: int) -> bool:
    """KILL each member through a pidfd taken before it is checked again (still in the container,
    still the uid): a pid freed and reused by another process after the listing is never hit.
    False when one was not ours to signal."""
    permitted = True
    for pid in members.pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone
        except OSError:
            permitted = False  # no pidfds here (a kernel before 5.3): the caller does it inside
            continue
        try:
            try:
                with open(f"/proc/{pid}/status") as f:
                    status = f.read()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if not runs_as(status, host_uid_) or not in_container(pid, container_id):
                continue
            try:
                signals.pidfd_send_signal(fd, signals.SIGKILL)
            except ProcessLookupError:
                pass
            except PermissionError:
                permitted = False
        finally:
            os.close(fd)
    return permitted


def _signal_until_gone(
    api: Any,
    container_id: str,
    members_now: Callable[[], Members],
    signal: str,
    send: Callable[[Members, str], bool] = signal_members,
) -> bool | None:
    members = members_now()
    if not members.visible:
        return None
    if not send(members, signal):
        return None  # not ours to signal from here: the caller does it inside
    if signal != "KILL":
        return True
    for round_ in range(ROUNDS):
        time.sleep(0.05 * 2**round_)  # killed processes take a moment to exit (longer on a busy host)
        members = members_now()
        if not members.visible:
            return None  # not seeing the processes is not seeing them gone: the caller checks inside
        if not members.pids:
            return True
        # from the second round the container is frozen (the cgroup freezer) while its members
        # are listed and signalled: nothing can fork in between
        frozen = round_ > 0 and _pause(api, container_id)
        try:
            if frozen:
                members = members_now()
            send(members, "KILL")
        finally:
            if frozen:
                _unpause(api, container_id)
    time.sleep(0.5)
    last = members_now()
    return None if not last.visible else not last.pids


def _pause(api: Any, container_id: str) -> bool:
    try:
        api.pause(container_id)
    except docker.errors.APIError:
        return False
    return True


def _unpause(api: Any, container_id: str) -> None:
    with contextlib.suppress(docker.errors.APIError):
        api.unpause(container_id)


def kill_exec(api: Any, container_id: str, exec_id: str) -> bool | None:
    """KILL the process an exec started (a stuck resident agent), from the host.

    Only a pid the engine lists for this container is signalled. Returns whether it was signalled,
    None when the processes are not visible from this host (it then lives on until its sandbox
    goes: it is confined to it, and counts against its pids limit).
    """
    try:
        found = api.exec_inspect(exec_id)
    except docker.errors.APIError:
        return False
    if not found.get("Running"):
        return False  # it ended: its pid may be another process's by now
    pid = int(found.get("Pid") or 0)
    pids = container_pids(api, container_id)
    if pids is None:
        return None
    if pid <= 1 or pid not in pids or not in_container(pid, container_id):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, 9)
        return True
    return False


def in_container(pid: int, container_id: str) -> bool:
    """Whether the host process `pid` is in the container's cgroup (its id is in the path)."""
    try:
        with open(f"/proc/{pid}/cgroup") as cgroups:
            return container_id in cgroups.read()
    except OSError:
        return False
