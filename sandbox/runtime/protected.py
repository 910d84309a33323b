"""Protected paths inside the container: `.git/hooks`, `.git/config` and the like, mounted read-only.

The file tools refuse to write protected paths, but `exec` could still write a hook or
`core.fsmonitor`, which git then runs on the host. So each protected path of a writable
workspace is bind-mounted read-only over the workspace, and every directory between the
workspace and it is bind-mounted onto itself (read-write): a mount point cannot be renamed or
removed, so the sandbox cannot move `.git` aside and build a writable one in its place.

Literal paths are always mounted (created empty first when absent, so they cannot be created
later); glob patterns (`**` spans directories) are expanded against what exists when the spec
is built. Links are never followed: a protected path reached through a link refuses the sandbox.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sandbox.config.protected import is_glob, pattern_parts
from sandbox.errors import BindRefused

Kind = Literal["dir", "file", "keep"]
MAX_VISITED = 20_000  # directory entries a `**` expansion may look at
SKIP_DIRS = frozenset({"objects", "lfs"})  # git object stores: large, and never hold hooks or config


@dataclass(frozen=True)
class ProtectedMount:
    """One mount over the workspace: a read-only protected path, or a self-bind that pins a parent."""

    parts: tuple[str, ...]  # below the workspace
    kind: Kind
    origin: str

    @property
    def read_only(self) -> bool:
        """Protected paths are read-only; the pinned parents stay writable."""
        return self.kind != "keep"

    @property
    def rel(self) -> str:
        """The path below the workspace, `/`-joined."""
        return "/".join(self.parts)


def _lstat(workspace: Path, parts: Sequence[str]) -> os.stat_result | None:
    """lstat without following links at any component; refuse a link on the way."""
    current = workspace
    for index, name in enumerate(parts):
        current = current / name
        try:
            info = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISLNK(info.st_mode):
            raise BindRefused(
                f"protected path {'/'.join(parts)!r}: {current} is a symbolic link",
                rule="protected-path-link",
                path=str(current),
                fix="replace the link with the real directory or file, or drop it from tools.fs.protected_paths",
            )
        if index < len(parts) - 1 and not stat.S_ISDIR(info.st_mode):
            return None
    return info


def _expand(workspace: Path, pattern: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """Existing paths below `workspace` matching `pattern`, found without following links."""
    budget = [MAX_VISITED]

    def walk(done: tuple[str, ...], rest: Sequence[str]) -> Iterator[tuple[str, ...]]:
        if not rest:
            yield done
            return
        head = rest[0]
        if head == "**":
            yield from walk(done, rest[1:])
        try:
            with os.scandir(workspace.joinpath(*done)) as entries:
                names = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in entries)
        except OSError:
            return
        for name, is_dir in names:
            budget[0] -= 1
            if budget[0] < 0:
                return
            if head == "**":
                if is_dir and name not in SKIP_DIRS:
                    yield from walk((*done, name), rest)
            elif fnmatch.fnmatchcase(name, head) and (is_dir or len(rest) == 1):
                yield from walk((*done, name), rest[1:])

    seen: set[tuple[str, ...]] = set()
    for found in walk((), pattern):
        if found and found not in seen:
            seen.add(found)
            yield found


def _kind_of(parts: tuple[str, ...], info: os.stat_result | None, pattern: str) -> Kind:
    if info is not None:
        return "dir" if stat.S_ISDIR(info.st_mode) else "file"
    # absent: made before the container starts, so it cannot be made later from inside
    return "dir" if pattern.endswith("/") or parts[-1] == "hooks" else "file"


def protected_mounts(workspace: Path | None, patterns: Sequence[str]) -> list[ProtectedMount]:
    """The mounts that keep `patterns` read-only inside a container over a writable `workspace`.

    `workspace` None: a workspace not on this host (a Kubernetes claim): only the literal paths,
    their kind told by their name; globs are expanded only where the files can be seen.

    Raises:
        BindRefused: a protected path (or a parent of one) is a symbolic link.
    """
    chosen: dict[tuple[str, ...], ProtectedMount] = {}
    for index, pattern in enumerate(patterns):
        parts = pattern_parts(pattern)
        if parts is None or (workspace is None and is_glob(parts)):
            continue
        origin = f"tools.fs.protected_paths[{index}] ({pattern})"
        found = list(_expand(workspace, parts)) if workspace is not None and is_glob(parts) else [parts]
        for path in found:
            info = _lstat(workspace, path) if workspace is not None else None
            if info is None and is_glob(parts):
                continue
            if info is not None and not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                continue  # a socket or device: nothing git would run
            if workspace is not None and _blocked_by_file(workspace, path):
                continue  # e.g. `.git` is a file (a linked worktree): the git dir lives elsewhere
            chosen.setdefault(path, ProtectedMount(path, _kind_of(path, info, pattern), origin))
    read_only_dirs = [m.parts for m in chosen.values() if m.kind == "dir"]
    out = sorted(chosen.values(), key=lambda m: m.parts)
    pins: dict[tuple[str, ...], ProtectedMount] = {}
    for mount in out:
        for cut in range(1, len(mount.parts)):
            parent = mount.parts[:cut]
            if parent in chosen or any(parent[: len(d)] == d for d in read_only_dirs):
                continue
            pins.setdefault(parent, ProtectedMount(parent, "keep", f"pins the parent of {mount.rel}"))
    inside_ro = [m for m in out if any(m.parts[: len(d)] == d and m.parts != d for d in read_only_dirs)]
    return sorted([*pins.values(), *(m for m in out if m not in inside_ro)], key=lambda m: m.parts)


def _blocked_by_file(workspace: Path, parts: Sequence[str]) -> bool:
    """Whether a parent of `parts` exists and is not a directory."""
    current = workspace
    for name in parts[:-1]:
        current = current / name
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(info.st_mode):
            return True
    return False
