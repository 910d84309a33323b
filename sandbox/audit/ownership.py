"""Whether the sandbox user can write what it is given read-write (SBX-M008).

A workspace that already exists keeps its owner (only a missing one is made for the sandbox
user), and the default user is the workspace's owner unless that is root. So a root-owned
workspace with `workspace_access: rw` mounts fine, runs as 1000:1000, and refuses every write.
`explain`, `doctor` and `audit` all ask :func:`write_problem`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class WriteProblem:
    """A read-write mount its sandbox cannot write: what is wrong, and the fix."""

    path: str
    detail: str
    fix: str


def _ids(user: str) -> tuple[int, int] | None:
    """(uid, gid) of a numeric `uid[:gid]` (gid defaults to uid); None for a user name."""
    uid, _, gid = user.strip().partition(":")
    if user.strip() == "root":
        return 0, 0
    if not uid.isdigit() or not (gid or uid).isdigit():
        return None  # a name in the image's /etc/passwd: its ids cannot be read from here
    return int(uid), int(gid or uid)


def write_problem(path: str, user: str, cap_add: Iterable[str] = ()) -> WriteProblem | None:
    """Why the container user `user` cannot write the host directory `path`; None when it can,
    or when that cannot be told here (a user name, a path that does not exist yet, ACLs aside)."""
    ids = _ids(user)
    try:
        info = os.stat(path)
    except OSError:
        return None
    if ids is None or not stat.S_ISDIR(info.st_mode):
        return None
    uid, gid = ids
    if uid == 0 and {c.upper().removeprefix("CAP_") for c in cap_add} & {"DAC_OVERRIDE", "ALL"}:
        return None
    mode = info.st_mode
    # the first class that matches decides (owner, else group, else others), as the kernel does
    if uid == info.st_uid:
        bits = mode & stat.S_IWUSR and mode & stat.S_IXUSR
    elif gid == info.st_gid:
        bits = mode & stat.S_IWGRP and mode & stat.S_IXGRP
    else:
        bits = mode & stat.S_IWOTH and mode & stat.S_IXOTH
    if bits:
        return None
    return WriteProblem(
        path,
        f"{path} is owned by {info.st_uid}:{info.st_gid} (mode {stat.S_IMODE(mode):o}) and the sandbox "
        f"runs as {user}: it is mounted read-write, yet every write in it fails",
        f"chown -R {uid}:{gid} {path} (give it to the sandbox user), or set sandbox.docker.user "
        "to a uid:gid that owns it (not root)",
    )
