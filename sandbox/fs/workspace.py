"""The file view a tool gets: the workspace (and optionally bind mounts), with every rule applied."""

from __future__ import annotations

import fnmatch
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread

from sandbox.config.models import FsSection
from sandbox.config.protected import is_protected  # `**` globs: submodules, worktrees
from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.locks import file_lock
from sandbox.fs.paths import WorkspacePath, split_path
from sandbox.fs.quota import WorkspaceQuota
from sandbox.fs.safe import FileStat, SafeRoot
from sandbox.fs.states import SeenFiles, digest
from sandbox.fs.walk import list_beneath


@dataclass(frozen=True)
class Root:
    """One directory the tools may reach: where the sandbox sees it and where it is on the host."""

    container_path: str
    host: Path
    read_only: bool
    label: str  # says which mount it is, for refusals


@dataclass(frozen=True)
class Located:
    """A resolved tool path."""

    root: Root
    path: WorkspacePath

    @property
    def display(self) -> str:
        """The path as the sandbox sees it."""
        rel = self.path.relative
        return self.root.container_path if rel == "." else f"{self.root.container_path.rstrip('/')}/{rel}"

    @property
    def key(self) -> str:
        """A stable key (host path) for locks and file states."""
        return str(self.root.host / self.path.relative)


class WorkspaceFiles:
    """Safe file access for one session.

    Args:
        roots: the workspace first, then bind mounts (only reachable when workspace_only is off).
        fs: the `tools.fs` settings.
        states: this session's file states.
        lock_dir: where cross-process file locks live.
        owner: (uid, gid) for files this process creates (the sandbox user).
        quota: the workspace's measured quota (writes to the workspace are checked against it).
        group_shared: new files and folders are group-writable (sessions with uids of their own
            share the workspace through the sandbox user's group).
    """

    host_side = True  # the orchestrator reads and writes the workspace's folder itself

    def __init__(
        self,
        roots: list[Root],
        fs: FsSection,
        states: SeenFiles,
        lock_dir: Path,
        owner: tuple[int, int] | None = None,
        quota: WorkspaceQuota | None = None,
        *,
        group_shared: bool = False,
    ) -> None:
        self.roots = roots if not fs.workspace_only else roots[:1]
        self.quota = quota if quota is not None and quota.enabled and roots and not roots[0].read_only else None
        self.fs = fs
        self.states = states
        self.lock_dir = lock_dir
        self.safe_owner = owner
        self.group_shared = group_shared
        outer = quota.outer if quota is not None and quota.outer is not None and quota.outer.enabled else None
        self._safe = {
            # further writable roots (a child's /parent) count toward the tenant's quota only
            r.container_path: SafeRoot(r.host, owner, self.quota if i == 0 else outer, group_shared=group_shared)
            for i, r in enumerate(self.roots)
        }

    def locate(self, raw: str) -> Located:
        """Resolve a tool's path argument; refuse escapes, deny patterns and malformed paths."""
        prefixes: list[str] = []
        by_prefix: dict[str, Root] = {}
        for root in self.roots:
            for prefix in (root.container_path, str(root.host)):
                prefixes.append(prefix)
                by_prefix[prefix] = root
        prefix, parts = split_path(raw, tuple(prefixes))
        located = Located(by_prefix[prefix], parts)
        self._check_deny(located)
        return located

    def _check_deny(self, loc: Located) -> None:
        rel = loc.path.relative
        for pattern in self.fs.deny_patterns:
            if fnmatch.fnmatchcase(rel, pattern) or any(fnmatch.fnmatchcase(p, pattern) for p in loc.path.parts):
                raise SandboxError(
                    ErrorCode.PERMISSION_DENIED,
                    f"{loc.display}: matches the deny pattern {pattern!r} (tools.fs.deny_patterns); "
                    "file tools never read or write it",
                    path=loc.display,
                    pattern=pattern,
                )

    def check_writable(self, loc: Located) -> None:
        """Refuse writes to read-only mounts and protected paths, naming which."""
        if loc.root.read_only:
            raise SandboxError(
                ErrorCode.PERMISSION_DENIED,
                f"{loc.display}: {loc.root.label} is mounted read-only; nothing can be written there",
                path=loc.display,
                mount=loc.root.container_path,
            )
        protected = is_protected(self.fs.protected_paths, loc.path.relative)
        if protected is not None:
            raise SandboxError(
                ErrorCode.PERMISSION_DENIED,
                f"{loc.display}: {protected} is a protected path (tools.fs.protected_paths); "
                "it stays read-only even in a writable workspace",
                path=loc.display,
            )

    async def stat(self, loc: Located) -> FileStat | None:
        """A path's stat (links not followed), or None when it does not exist."""
        return await anyio.to_thread.run_sync(self.safe(loc).stat, loc.path)

    async def read_raw(self, loc: Located) -> tuple[bytes, FileStat]:
        """A regular file's bytes (up to tools.fs.max_read_bytes), without recording a version.

        Always in a worker thread: a read on the event loop's thread saved a quarter of a 4 KiB
        read's time, but the sandbox owns the file, and it can make even a read of memory wait
        for the disk (its close allocating blocks the sandbox left delayed, an access time to
        write, a readahead queued behind the sandbox's own I/O)."""
        return await anyio.to_thread.run_sync(self.safe(loc).read_bytes, loc.path, self.fs.max_read_bytes)

    async def write_raw(self, loc: Located, data: bytes, mode: int | None = None) -> FileStat:
        """Replace a file atomically (no write checks, no version recorded: the caller holds the lock)."""
        safe = self.safe(loc)
        if mode is None:
            return await anyio.to_thread.run_sync(safe.write_atomic, loc.path, data)
        return await anyio.to_thread.run_sync(safe.write_atomic, loc.path, data, mode)

    async def list_names(self, loc: Located, *, suffix: str, max_depth: int, limit: int) -> list[str]:
        """Root-relative names of the files and links beneath folder `loc` ending in `suffix` (no link followed)."""
        return await anyio.to_thread.run_sync(
            lambda: list_beneath(loc.root.host, loc.path.parts, suffix=suffix, max_depth=max_depth, limit=limit)
        )

    async def unlink(self, loc: Located) -> None:
        """Remove a file (a link is removed itself, never its target)."""
        await anyio.to_thread.run_sync(self.safe(loc).unlink, loc.path)

    def lock(self, loc: Located) -> AbstractAsyncContextManager[None]:
        """The cross-process lock of one file (one writer at a time)."""
        return file_lock(self.lock_dir, loc.key)

    def safe(self, loc: Located) -> SafeRoot:
        """The symlink-proof accessor of a location's root."""
        return self._safe[loc.root.container_path]

    async def read(self, loc: Located) -> tuple[bytes, FileStat]:
        """Read a file (:meth:`read_raw`) and remember the version this session saw."""
        data, st = await self.read_raw(loc)
        await self.states.record(loc.key, data, st.mtime_ns)
        return data, st

    async def write(self, loc: Located, data: bytes) -> FileStat:
        """Write atomically (after the write checks) and remember the version written."""
        self.check_writable(loc)
        async with file_lock(self.lock_dir, loc.key):
            st = await anyio.to_thread.run_sync(self.safe(loc).write_atomic, loc.path, data)
        await self.states.record(loc.key, data, st.mtime_ns)
        return st

    async def changed_since_seen(self, loc: Located, current: bytes) -> bool:
        """Whether the file differs from what this session last read or wrote (False if never seen)."""
        seen = await self.states.get(loc.key)
        return seen is not None and seen.sha256 != digest(current)
