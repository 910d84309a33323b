"""The file tools' view of a workspace the host cannot see (`workspace_store: volume`).

The workspace is a Docker volume; the sandbox's resident agent opens files beneath it and never
through a symbolic link (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, else an O_NOFOLLOW walk:
images/sandbox/sandbox_agent.py), and the bytes travel over the agent's stream. Every rule of
the host-side view holds (paths, deny patterns, protected paths, read-only mounts, versions for
CONFLICT, per-file locks): only the I/O differs. What the agent answers is the sandbox's own
workspace, so a lying agent can only lie about that.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio.to_thread

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.safe import FileStat, denied_error, map_os_error, not_regular_error
from sandbox.fs.states import digest
from sandbox.fs.walk import walk_order
from sandbox.fs.workspace import Located, WorkspaceFiles
from sandbox.runtime.agent.frames import FileInfo

if TYPE_CHECKING:
    from sandbox.runtime.agent.frames import FileRefused, Reply
    from sandbox.runtime.protocol import AgentChannel

WRITE_CHUNK = 4 << 20  # one frame's payload (the agent takes 8 MiB at most)
LIST_TIMEOUT_S = 30.0  # a listing of the sandbox's own volume; past it, what was listed


class AgentFiles(WorkspaceFiles):
    """:class:`WorkspaceFiles` whose reads and writes go through the sandbox's agent.

    Args:
        link: returns the agent link of the session's sandbox (started when needed).
        args, kwargs: as for WorkspaceFiles; a root's `host` is only a name here (locks, versions).
    """

    host_side = False

    def __init__(self, link: Callable[[], Awaitable[AgentChannel]], *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._link = link

    def _header(self, kind: str, loc: Located) -> dict[str, object]:
        return {
            "t": kind,
            "root": loc.root.container_path,
            "parts": list(loc.path.parts),
            "dir_mode": 0o2775 if self.group_shared else 0o755,
        }

    async def _ask(
        self, kind: str, loc: Located, chunks: tuple[bytes, ...] = (b"",), *, extra: dict[str, object] | None = None
    ) -> tuple[FileInfo | FileRefused | Reply, bytes]:
        link = await self._link()
        limit = self.fs.max_read_bytes + 1 if kind == "fread" else 0
        return await link.file_request({**self._header(kind, loc), **(extra or {})}, chunks, data_limit=limit)

    async def stat(self, loc: Located) -> FileStat | None:
        """A path's stat (links not followed), or None when it does not exist."""
        reply, _ = await self._ask("fstat", loc)
        if getattr(reply, "t", "") == "ferror" and getattr(reply, "errno", 0) in (errno.ENOENT, errno.ENOTDIR):
            return None
        info = _info(reply, loc)
        return FileStat(info.size, info.mtime_ns, info.mode) if info.exists else None

    async def read_raw(self, loc: Located) -> tuple[bytes, FileStat]:
        """A regular file's bytes (up to tools.fs.max_read_bytes), without recording a version."""
        reply, data = await self._ask("fread", loc, extra={"max": self.fs.max_read_bytes})
        info = _info(reply, loc)
        if len(data) != info.size:
            raise SandboxError(
                ErrorCode.CONFLICT, f"{loc.display}: changed while it was read ({len(data)} of {info.size} bytes)"
            )
        return data, FileStat(info.size, info.mtime_ns, info.mode)

    async def read(self, loc: Located) -> tuple[bytes, FileStat]:
        """Read a file and remember the version this session saw."""
        data, st = await self.read_raw(loc)
        await self.states.record(loc.key, data, st.mtime_ns)
        return data, st

    async def write_raw(self, loc: Located, data: bytes, mode: int | None = None) -> FileStat:
        """Replace a file atomically (temp file + rename in the sandbox), no checks."""
        if not loc.path.parts:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, "cannot write to the workspace root itself")
        if self.quota is not None and loc.root is self.roots[0]:
            old = await self.stat(loc)
            grown_from = old.size if old is not None and old.is_file else 0
            await anyio.to_thread.run_sync(self.quota.check_write, len(data), grown_from, loc.path.relative)
        chunks = tuple(data[i : i + WRITE_CHUNK] for i in range(0, len(data), WRITE_CHUNK)) or (b"",)
        new_mode = mode if mode is not None else (0o664 if self.group_shared else 0o644)
        reply, _ = await self._ask("fwrite", loc, chunks, extra={"mode": new_mode})
        info = _info(reply, loc)
        if info.size != len(data):
            raise SandboxError(
                ErrorCode.INTERNAL, f"{loc.display}: the agent wrote {info.size} of {len(data)} bytes; write it again"
            )
        return FileStat(info.size, info.mtime_ns, info.mode)

    async def write(self, loc: Located, data: bytes) -> FileStat:
        """Write atomically (after the write checks) and remember the version written."""
        self.check_writable(loc)
        async with self.lock(loc):
            st = await self.write_raw(loc, data)
        await self.states.record(loc.key, data, st.mtime_ns)
        return st

    async def unlink(self, loc: Located) -> None:
        """Remove a file (a link itself, never its target)."""
        reply, _ = await self._ask("funlink", loc)
        if getattr(reply, "t", "") == "ferror":
            _info(reply, loc)

    async def list_names(self, loc: Located, *, suffix: str, max_depth: int, limit: int) -> list[str]:
        """Root-relative names of the files and links beneath folder `loc` ending in `suffix`.

        The agent has no listing request, so `find -P` (links never followed, not even the start)
        runs in the sandbox as its user; the names only choose what is then read through the
        agent's file requests, which refuse links and escapes on their own.
        """
        start = "/".join((loc.root.container_path.rstrip("/"), *loc.path.parts))
        argv = ["find", "-P", start, "-mindepth", "1", "-maxdepth", str(max_depth)]
        argv += ["(", "-type", "f", "-o", "-type", "l", ")", "-name", f"*{suffix}", "-print0"]
        result = await (await self._link()).run(argv, timeout_s=LIST_TIMEOUT_S)
        prefix = loc.root.container_path.rstrip("/") + "/"
        names = [
            found[len(prefix) :]
            for found in result.stdout.decode("utf-8", "replace").split("\0")
            if found.startswith(prefix)
        ]
        return sorted(names, key=walk_order)[:limit]

    async def changed_since_seen(self, loc: Located, current: bytes) -> bool:
        """Whether the file differs from what this session last read or wrote (False if never seen)."""
        seen = await self.states.get(loc.key)
        return seen is not None and seen.sha256 != digest(current)

    def safe(self, loc: Located) -> object:  # type: ignore[override]
        """There is no host-side path to this workspace."""
        raise SandboxError(
            ErrorCode.SANDBOX_UNAVAILABLE,
            f"{loc.display}: this workspace is a Docker volume (workspace_store: volume); "
            "it is reached through the sandbox's agent only",
        )


def _info(reply: FileInfo | FileRefused | Reply, loc: Located) -> FileInfo:
    """The answer as file facts; a refusal as the error a host-side workspace gives."""
    if isinstance(reply, FileInfo):
        return reply
    rel = loc.path.relative
    why = getattr(reply, "why", "")
    if why == "not_regular":
        raise not_regular_error(rel)
    if why == "too_big":
        raise SandboxError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{rel}: is {getattr(reply, 'size', 0)} bytes, over the read limit; read a part via exec (head, sed -n)",
            path=rel,
        )
    if why == "symlink":  # ELOOP, or EXDEV (a path that would leave the root): never followed
        raise map_os_error(OSError(errno.ELOOP, ""), rel)
    if why == "the root itself":
        raise denied_error(rel, "the workspace root itself cannot be read or written as a file")
    code = getattr(reply, "errno", errno.EIO)
    raise map_os_error(OSError(code, ""), rel)
