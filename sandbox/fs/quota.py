"""A measured quota on what a sandbox may store on the host through its workspace.

Bind mounts have no size limit of their own: a hard limit needs a filesystem with project
quotas (XFS `pquota`, ext4 `prjquota`) under the workspace, which Docker does not manage for
binds. So the quota is measured: disk usage (allocated blocks, so sparse files count for what
they really take) is walked without following links, cached briefly, and checked before every
file-tool write and while a command runs.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import ErrorCode, SandboxError

CACHE_S = 2.0  # a measurement is reused this long (writes in between are added to it)
SMALL_WALK = 64  # entries a folder may hold to be measured on the event loop (about 0.1 ms)
SMALL_DIR_BYTES = 64 * 1024  # and the size each of its folders may have (a listing reads all of it)
KEPT = 1024  # root sets remembered before stale ones are forgotten (a month makes millions of sessions)
_UNITS = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(size: str) -> int:
    """`512m`, `1g`, `4096` -> bytes."""
    last = size[-1].lower()
    return int(size[:-1]) * _UNITS[last] if last in _UNITS else int(size)


class TooManyEntries(Exception):
    """A walk bounded to a few entries met more (the caller walks off the event loop instead)."""


def disk_usage(root: Path, max_entries: int | None = None) -> int:
    """Bytes allocated under `root` (links are counted, never followed; other filesystems skipped).

    Raises:
        TooManyEntries: `root` holds more than `max_entries` entries (when given).
    """
    total = 0
    seen = 0
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return 0
    device = top.st_dev
    if max_entries is not None and top.st_size > SMALL_DIR_BYTES:
        raise TooManyEntries(root)
    stack = [os.fspath(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = os.scandir(folder)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        with entries:
            for entry in entries:
                seen += 1
                if max_entries is not None and seen > max_entries:
                    raise TooManyEntries(root)
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_dev != device:
                    continue  # a mount below the workspace is not the workspace's disk
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    # a folder that once held many entries keeps its size (ext4 never shrinks one):
                    # listing it scans every block, however few entries are left
                    if max_entries is not None and st.st_size > SMALL_DIR_BYTES:
                        raise TooManyEntries(root)
                    stack.append(entry.path)
    return total


@dataclass
class _Measure:
    at: float
    used: int


class WorkspaceQuota:
    """A measured quota over one or more directories, with the quota that contains it.

    A session's workspace has its own (`sandbox.workspace_quota`) inside its tenant's
    (`tenants[].quotas.max_workspace_bytes`, summed over every workspace of the tenant's agents):
    a write must fit both, and a command is stopped when it takes either past its limit.

    Args:
        roots: the directories measured together.
        limit: bytes they may hold; 0 means no limit at this level.
        key: the config key that sets it, for messages.
        outer: the quota this one lies in (checked too), if any.
        label: what is measured, for messages.
    """

    _cache: dict[tuple[str, ...], _Measure] = {}  # noqa: RUF012 - one measurement per root set, process-wide
    _walks: dict[tuple[str, ...], threading.Lock] = {}  # noqa: RUF012 - one walk at a time per root set
    _lock = threading.Lock()

    def __init__(
        self,
        roots: Sequence[Path],
        limit: int,
        key: str = "sandbox.workspace_quota",
        outer: WorkspaceQuota | None = None,
        label: str = "the workspace",
    ) -> None:
        self.roots = tuple(roots)
        self.label = label
        self.limit = limit
        self.key = key
        self.outer = outer
        self._name = tuple(sorted({os.fspath(r) for r in self.roots}))

    @property
    def levels(self) -> list[WorkspaceQuota]:
        """This quota and those containing it, each with a limit (innermost first)."""
        out: list[WorkspaceQuota] = []
        level: WorkspaceQuota | None = self
        while level is not None:
            if level.limit > 0:
                out.append(level)
            level = level.outer
        return out

    @property
    def enabled(self) -> bool:
        """Whether any limit applies."""
        return bool(self.levels)

    def used(self, *, fresh: bool = False) -> int:
        """Bytes used now at this level (a measurement at most CACHE_S old unless `fresh`).

        One walk per root set at a time: callers that wait for a walk in progress take its
        result rather than walking again (a tenant's folders can hold many files)."""
        asked = time.monotonic()
        with self._lock:
            cached = self._fresh_locked(self._name, asked)
            walking = self._walks.setdefault(self._name, threading.Lock())
        if cached is not None and not fresh:
            return cached.used
        with walking:
            with self._lock:
                cached = self._cache.get(self._name)
            if cached is not None and cached.at >= asked:
                return cached.used  # measured by another caller after we asked
            used = sum(disk_usage(Path(name)) for name in self._name)
            with self._lock:
                self._store_locked(used)
            return used

    def _fresh_locked(self, name: tuple[str, ...], now: float) -> _Measure | None:
        """The measurement of `name` if younger than CACHE_S (the caller holds `_lock`)."""
        found = self._cache.get(name)
        return found if found is not None and now - found.at < CACHE_S else None

    def _store_locked(self, used: int) -> None:
        """Keep a measurement (the caller holds `_lock`). Past KEPT root sets, those measured
        longer ago than CACHE_S are forgotten, with their walk locks when nobody walks: a stale
        measurement is never used, so forgetting it only costs the walk that would come anyway."""
        now = time.monotonic()
        self._cache[self._name] = _Measure(now, used)
        if len(self._cache) <= KEPT:
            return
        for name in [n for n, m in self._cache.items() if now - m.at >= CACHE_S]:
            del self._cache[name]
        for name in [n for n, lock in self._walks.items() if n not in self._cache and not lock.locked()]:
            del self._walks[name]

    def cached(self) -> bool:
        """Whether every level with a limit has a measurement young enough to be used unwalked."""
        now = time.monotonic()
        with self._lock:
            return all(self._fresh_locked(level._name, now) is not None for level in self.levels)

    def charge(self, grown: int) -> None:
        """Add a write's growth to the cached measurements (so writes in a burst add up)."""
        with self._lock:
            for level in self.levels:
                cached = self._cache.get(level._name)
                if cached is not None:
                    cached.used = max(0, cached.used + grown)

    def check_write(self, new_size: int, old_size: int, what: str) -> None:
        """Refuse a write that would take any level past its limit (QUOTA_EXCEEDED)."""
        grow = new_size - old_size
        if grow <= 0:
            return
        for level in self.levels:
            used = level.used()
            if used + grow > level.limit:
                used = level.used(fresh=True)  # refuse on a measurement, never on a stale estimate
            if used + grow > level.limit:
                raise level.exceeded(used, f"writing {what} ({new_size:,} bytes) would take it past the quota")
        self.charge(grow)

    def measure(self) -> list[int]:
        """Use when a command starts, for :meth:`breached`: this quota's own folders fresh (even
        without a limit of its own: growth is judged there), the containing levels through the
        shared cache."""
        out = [self.used(fresh=True)]
        level = self.outer
        while level is not None:
            out.append(level.used() if level.limit > 0 else 0)
            level = level.outer
        return out

    def measure_small(self, max_entries: int = SMALL_WALK) -> list[int] | None:
        """:meth:`measure` without blocking for long, or None: this quota's folders walked only
        when they hold at most `max_entries` entries, none of its folders larger than
        SMALL_DIR_BYTES (a folder emptied of 400,000 files lists in milliseconds), the
        containing levels only from fresh cached measurements. A small workspace is measured in
        microseconds on the caller's thread; anything more is :meth:`measure`'s, in a worker
        thread."""
        now = time.monotonic()
        outer: list[int] = []
        level = self.outer
        with self._lock:
            while level is not None:
                found = self._fresh_locked(level._name, now) if level.limit > 0 else None
                if level.limit > 0 and found is None:
                    return None
                outer.append(found.used if found is not None else 0)
                level = level.outer
        try:
            used = sum(disk_usage(Path(name), max_entries) for name in self._name)
        except TooManyEntries:
            return None
        with self._lock:
            self._store_locked(used)
        return [used, *outer]

    def breached(self, start: Sequence[int]) -> tuple[WorkspaceQuota, int] | None:
        """The first level a running command has taken past its limit, with its use; None while
        the command's own folders have not grown since `start` (what :meth:`measure` gave), so a
        neighbour's bytes never stop a command that writes nothing."""
        own = self.used(fresh=True)
        if own <= start[0]:
            return None
        level: WorkspaceQuota | None = self
        while level is not None:
            if level.limit > 0:
                used = own if level is self else level.used()
                if used > level.limit:
                    return level, used
            level = level.outer
        return None

    def exceeded(self, used: int, why: str) -> SandboxError:
        """The error a model gets when this level is (or would be) over its limit."""
        return SandboxError(
            ErrorCode.QUOTA_EXCEEDED,
            f"{self.label} use {used:,} of {self.limit:,} bytes ({self.key}); {why}. "
            "Delete files you no longer need (exec `rm`, or `du -sh *` to see what is large)",
            used=used,
            limit=self.limit,
        )
