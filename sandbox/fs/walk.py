"""Names beneath a host-side workspace folder, walked without following a link.

What `Files.list_names` does for a workspace on this host's paths (fs/workspace.py); a workspace
the host cannot see lists through the sandbox's agent instead (runtime/agent/files.py).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def walk_order(relative: str) -> list[str]:
    """The sort key that lists a folder's entries by name, each folder's content at its place."""
    return relative.split("/")


def _walk(fd: int, prefix: str, depth: int, spec: tuple[str, int, int], out: list[str]) -> None:
    suffix, max_depth, limit = spec
    with os.scandir(fd) as entries:  # scandir duplicates the fd
        for entry in sorted(entries, key=lambda e: e.name):
            if len(out) >= limit:
                return
            mode = entry.stat(follow_symlinks=False).st_mode
            rel = f"{prefix}/{entry.name}" if prefix else entry.name
            if (stat.S_ISREG(mode) or stat.S_ISLNK(mode)) and entry.name.endswith(suffix):
                out.append(rel)  # a link is listed so the safe layer refuses it (and the caller says so)
            elif stat.S_ISDIR(mode) and depth < max_depth:
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                try:
                    _walk(sub, rel, depth + 1, spec, out)
                finally:
                    os.close(sub)


def list_beneath(root: Path, parts: Sequence[str], *, suffix: str, max_depth: int, limit: int) -> list[str]:
    """Root-relative names of the regular files and links beneath `root/parts...` ending in `suffix`.

    Sorted as a walk by name; folders deeper than `max_depth` below the start and links to
    folders are never entered; at most `limit` names. A start that is missing, not a folder,
    or reached through a link lists nothing. Only names come from here.
    """
    out: list[str] = []
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return out
    try:
        for name in parts:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
        _walk(fd, "/".join(parts), 1, (suffix, max_depth, limit), out)
    except OSError:
        pass  # missing, a link (never followed), or changed under the walk: what was listed
    finally:
        os.close(fd)
    return out
