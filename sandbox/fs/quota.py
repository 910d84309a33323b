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
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import ErrorCode, SandboxError

CACHE_S = 2.0  # a measurement is reused this long (writes in between are added to it)
_UNITS = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(size: str) -> int:
    """`512m`, `1g`, `4096` -> bytes."""
    last = size[-1].lower()
    return int(size[:-1]) * _UNITS[last] if last in _UNITS else int(size)


def disk_usage(root: Path) -> int:
    """Bytes allocated under `root` (links are counted, never followed; other filesystems skipped)."""
    total = 0
    try:
        device = os.lstat(root).st_dev
    except FileNotFoundError:
        return 0
    stack = [os.fspath(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = os.scandir(folder)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_dev != device:
                    continue  # a mount below the workspace is not the workspace's disk
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return total


@dataclass
class _Measure:
    at: float
    used: int


class WorkspaceQuota:
    """The quota of one workspace directory.

    Args:
        root: the workspace's host directory.
        limit: bytes it may hold; 0 means no quota.
        key: the config key that sets it, for messages.
    """

    _cache: dict[str, _Measure] = {}  # noqa: RUF012 - one measurement per directory, process-wide
    _lock = threading.Lock()

    def __init__(self, root: Path, limit: int, key: str = "sandbox.workspace_quota") -> None:
        self.root = root
        self.limit = limit
        self.key = key

    @property
    def enabled(self) -> bool:
        """Whether a quota applies."""
        return self.limit > 0

    def used(self, *, fresh: bool = False) -> int:
        """Bytes used now (a measurement at most CACHE_S old unless `fresh`)."""
        name = os.fspath(self.root)
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and not fresh and time.monotonic() - cached.at < CACHE_S:
            return cached.used
        used = disk_usage(self.root)
        with self._lock:
            self._cache[name] = _Measure(time.monotonic(), used)
        return used

    def charge(self, grown: int) -> None:
        """Add a write's growth to the cached measurement (so writes in a burst add up)."""
        with self._lock:
            cached = self._cache.get(os.fspath(self.root))
            if cached is not None:
                cached.used = max(0, cached.used + grown)

    def check_write(self, new_size: int, old_size: int, what: str) -> None:
        """Refuse a write that would take the workspace over its quota (QUOTA_EXCEEDED)."""
        if not self.enabled or new_size <= old_size:
            return
        used = self.used()
        if used + (new_size - old_size) > self.limit:
            used = self.used(fresh=True)  # refuse on a measurement, never on a stale estimate
        if used + (new_size - old_size) > self.limit:
            raise self.exceeded(used, f"writing {what} ({new_size:,} bytes) would take it past the quota")
        self.charge(new_size - old_size)

    def exceeded(self, used: int, why: str) -> SandboxError:
        """The error a model gets when the workspace is (or would be) over its quota."""
        return SandboxError(
            ErrorCode.QUOTA_EXCEEDED,
            f"the workspace holds {used:,} of its {self.limit:,} bytes ({self.key}); {why}. "
            "Delete files you no longer need (exec `rm`, or `du -sh *` to see what is large)",
            used=used,
            limit=self.limit,
        )
