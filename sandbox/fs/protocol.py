"""What the file tools need from a workspace: the `Files` protocol.

Tools are written against this, never against where the files are. Today's implementation,
:class:`sandbox.fs.workspace.WorkspaceFiles`, works host-side on the directory a sandbox mounts
(every path walked with O_NOFOLLOW / dir_fd). A backend whose workspace is not a host directory
(a volume served by an agent in the sandbox, a remote engine, a pod) provides its own.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sandbox.config.models import FsSection
    from sandbox.fs.quota import WorkspaceQuota
    from sandbox.fs.safe import FileStat
    from sandbox.fs.states import SeenFiles
    from sandbox.fs.workspace import Located, Root


class Files(Protocol):
    """Safe access to one session's workspace (and, when allowed, its bind mounts)."""

    @property
    def roots(self) -> list[Root]:
        """The workspace first, then bind mounts the tools may reach."""
        ...

    @property
    def fs(self) -> FsSection:
        """The `tools.fs` settings (caps, deny patterns, protected paths)."""
        ...

    @property
    def states(self) -> SeenFiles:
        """The versions this session last read or wrote (for CONFLICT)."""
        ...

    @property
    def quota(self) -> WorkspaceQuota | None:
        """The workspace's quota, when one applies."""
        ...

    @property
    def safe_owner(self) -> tuple[int, int] | None:
        """The uid and gid host-side writes take (the sandbox user's); None: the orchestrator's."""
        ...

    @property
    def group_shared(self) -> bool:
        """Whether new files are group-writable (sessions with uids of their own share the workspace)."""
        ...

    @property
    def host_side(self) -> bool:
        """Whether the workspace is a host folder the orchestrator writes itself (False: only the
        sandbox reaches it, e.g. a Docker volume through the resident agent)."""
        ...

    def locate(self, raw: str) -> Located:
        """Resolve a tool's path argument; refuse escapes, deny patterns and malformed paths."""
        ...

    def check_writable(self, loc: Located) -> None:
        """Refuse writes to read-only mounts and protected paths."""
        ...

    async def read(self, loc: Located) -> tuple[bytes, FileStat]:
        """Read a file and remember the version this session saw."""
        ...

    async def write(self, loc: Located, data: bytes) -> FileStat:
        """Write atomically after the write checks, and remember the version written."""
        ...

    async def stat(self, loc: Located) -> FileStat | None:
        """A path's stat (links not followed), or None when it does not exist."""
        ...

    async def read_raw(self, loc: Located) -> tuple[bytes, FileStat]:
        """A regular file's bytes, without recording a version."""
        ...

    async def list_names(self, loc: Located, *, suffix: str, max_depth: int, limit: int) -> list[str]:
        """Root-relative names of the files and links beneath folder `loc` that end in `suffix`.

        Links are listed (a read of one is refused) and never entered; sorted as a walk by name,
        at most `limit`, folders at most `max_depth` deep; a missing folder lists nothing.
        """
        ...

    async def write_raw(self, loc: Located, data: bytes, mode: int | None = None) -> FileStat:
        """Replace a file atomically, no checks (the caller checked and holds the lock)."""
        ...

    async def unlink(self, loc: Located) -> None:
        """Remove a file (never a link's target)."""
        ...

    def lock(self, loc: Located) -> AbstractAsyncContextManager[None]:
        """The lock of one file: one writer at a time, across processes."""
        ...

    async def changed_since_seen(self, loc: Located, current: bytes) -> bool:
        """Whether a file differs from what this session last read or wrote."""
        ...
