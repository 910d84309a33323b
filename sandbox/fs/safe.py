"""Host-side file access that never follows a symlink: every component is opened with O_NOFOLLOW
relative to the directory fd before it, so a link planted (or swapped in) by the sandbox cannot
lead outside the root. Never realpath-then-open: that races.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.paths import WorkspacePath
from sandbox.fs.quota import WorkspaceQuota

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FileStat:
    """What the tools need to know about a file."""

    size: int
    mtime_ns: int
    mode: int

    @property
    def is_file(self) -> bool:
        """A regular file."""
        return stat.S_ISREG(self.mode)


def denied_error(rel: str, why: str) -> SandboxError:
    """PERMISSION_DENIED for `rel`, saying why."""
    return SandboxError(ErrorCode.PERMISSION_DENIED, f"{rel}: {why}", path=rel)


def not_regular_error(rel: str) -> SandboxError:
    """The refusal of a file that is not a regular one."""
    # fifos would block, devices and sockets are not file contents: never read
    return denied_error(rel, "is not a regular file (a fifo, socket or device); file tools only read regular files")


def map_os_error(exc: OSError, rel: str) -> SandboxError:
    """The file tools' error for an OSError met at `rel` (links, missing parents, permissions, space)."""
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return denied_error(rel, "a component is a symbolic link; links are not followed")
    if exc.errno == errno.ENOTDIR:
        return SandboxError(ErrorCode.FILE_NOT_FOUND, f"{rel}: a parent is not a directory", path=rel)
    if exc.errno == errno.ENOENT:
        return SandboxError(ErrorCode.FILE_NOT_FOUND, f"{rel}: no such file or directory", path=rel)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return denied_error(rel, "permission denied")
    if exc.errno == errno.EROFS:
        return denied_error(rel, "read-only file system")
    if exc.errno == errno.EISDIR:
        return SandboxError(ErrorCode.INVALID_ARGUMENTS, f"{rel}: is a directory", path=rel)
    if exc.errno == errno.EAGAIN:  # a non-blocking open of a file another process holds a lease on
        return SandboxError(
            ErrorCode.CONFLICT, f"{rel}: another process holds it (a file lease); try again later", path=rel
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SandboxError(
            ErrorCode.QUOTA_EXCEEDED, f"{rel}: no space left on the device that holds the workspace", path=rel
        )
    return SandboxError(ErrorCode.INTERNAL, f"{rel}: {os.strerror(exc.errno or 0)}", path=rel)


def fsync_dir(folder: Path) -> None:
    """Make a rename or link in `folder` durable: without it a crash soon after can lose the new name."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | Path) -> None:
    if isinstance(data, Path):
        with data.open("rb") as source:
            while chunk := source.read(1024 * 1024):
                _write_all(fd, chunk)
        return
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


READ_TRIES = 3  # a file whose size or times move under a read is read again, then refused


def _check_readable(st: os.stat_result, rel: str, max_bytes: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"{rel}: is a directory", path=rel)
    if not stat.S_ISREG(st.st_mode):
        raise not_regular_error(rel)
    if st.st_size > max_bytes:
        raise SandboxError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{rel}: is {st.st_size} bytes, over the {max_bytes}-byte read limit; "
            "read a part with offset/limit via exec (e.g. head, sed -n)",
            path=rel,
            size=st.st_size,
        )


def _pread_all(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from the start of `fd` (fewer at its end)."""
    chunks: list[bytes] = []
    offset = 0
    while offset < limit:
        chunk = os.pread(fd, min(limit - offset, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _same(before: os.stat_result, after: os.stat_result) -> bool:
    # ctime too: a sandbox can rewrite a file at the same size and set its mtime back, not its ctime
    return (before.st_size, before.st_mtime_ns, before.st_ctime_ns) == (
        after.st_size,
        after.st_mtime_ns,
        after.st_ctime_ns,
    )


class SafeRoot:
    """A directory tree accessed without ever following a symlink.

    Args:
        root: the directory (itself trusted: it comes from the config).
        owner: (uid, gid) given to files and directories this process creates, when it can.
        quota: the measured quota every write that grows a file is checked against first.
        group_shared: new files are 0664 and new folders 2775 (group-writable, group inherited).
    """

    def __init__(
        self,
        root: Path,
        owner: tuple[int, int] | None = None,
        quota: WorkspaceQuota | None = None,
        *,
        group_shared: bool = False,
    ) -> None:
        self.root = root
        self.owner = owner if os.geteuid() == 0 else None
        self.quota = quota
        self.file_mode = 0o664 if group_shared else 0o644
        self.dir_mode = 0o2775 if group_shared else 0o755

    @contextmanager
    def _dir(self, parts: tuple[str, ...], rel: str, *, create: bool = False) -> Iterator[int]:
        """An fd of the directory `parts`, walked component by component."""
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise map_os_error(exc, rel) from exc
        try:
            for part in parts:
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except NotADirectoryError:
                    # O_NOFOLLOW|O_DIRECTORY on a link says ENOTDIR: tell the two apart
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise OSError(errno.ELOOP, "symlink") from None
                    raise
                except FileNotFoundError:
                    if not create:
                        raise
                    # made concurrently? then it is opened (without following) just below
                    made = False
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, self.dir_mode, dir_fd=fd)
                        made = True
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    if made and self.owner:
                        os.fchown(nxt, *self.owner)
                    if made:
                        os.fchmod(nxt, self.dir_mode)  # past the process umask, after chown
                os.close(fd)
                fd = nxt
            yield fd
        except OSError as exc:
            raise map_os_error(exc, rel) from exc
        finally:
            os.close(fd)

    def stat(self, path: WorkspacePath) -> FileStat | None:
        """Stat without following; None when missing."""
        try:
            with self._dir(path.parts[:-1], path.relative) as dfd:
                st = os.stat(path.name, dir_fd=dfd, follow_symlinks=False) if path.parts else os.fstat(dfd)
        except SandboxError as exc:
            if exc.code == ErrorCode.FILE_NOT_FOUND:
                return None
            raise
        except FileNotFoundError:
            return None
        return FileStat(st.st_size, st.st_mtime_ns, st.st_mode)

    def read_bytes(self, path: WorkspacePath, max_bytes: int) -> tuple[bytes, FileStat]:
        """Read a regular file (refusing links, fifos, devices and files over `max_bytes`); the
        bytes and the stat returned are of one version of the file.

        Raises:
            SandboxError: those refusals, and CONFLICT for a file that kept changing while it
                was read (its size or times moved under the read, READ_TRIES times; one that
                only kept growing comes back as it was at its last size check) or that another
                process holds a write lease on.
        """
        rel = path.relative
        with self._dir(path.parts[:-1], rel) as dfd:
            try:
                fd = os.open(
                    path.name,
                    os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    dir_fd=dfd,
                )
            except OSError as exc:
                # open(2) of a Unix socket says ENXIO (EOPNOTSUPP on some file systems)
                if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):
                    raise not_regular_error(rel) from exc
                raise map_os_error(exc, rel) from exc
            try:
                for _ in range(READ_TRIES):
                    st = os.fstat(fd)
                    _check_readable(st, rel, max_bytes)
                    # one byte more than the size: a file that grew meanwhile is seen
                    data = _pread_all(fd, st.st_size + 1)
                    after = os.fstat(fd)
                    if len(data) == st.st_size and _same(st, after):
                        return data, FileStat(st.st_size, st.st_mtime_ns, st.st_mode)
                if len(data) > st.st_size and after.st_size > st.st_size:
                    # a file that keeps growing (a log being written): as it was at the size
                    # check, whose bytes an appending writer leaves as they were
                    return data[: st.st_size], FileStat(st.st_size, st.st_mtime_ns, st.st_mode)
                raise SandboxError(
                    ErrorCode.CONFLICT,
                    f"{rel}: changed while it was read ({READ_TRIES} times); read it again once it is written",
                    path=rel,
                )
            finally:
                os.close(fd)

    def write_atomic(self, path: WorkspacePath, data: bytes | Path, mode: int | None = None) -> FileStat:
        """Write via a temp file in the same directory and rename: readers see old or new, never a mix.

        `data` is the content, or a trusted host file whose content is copied in chunks (never
        whole in memory). A symlink at the final name is replaced by the file, never written
        through. An existing regular file keeps its mode; a new one gets `mode` (default 0644,
        0664 when group-shared).
        """
        mode = self.file_mode if mode is None else mode
        size = data.stat().st_size if isinstance(data, Path) else len(data)
        rel = path.relative
        if not path.parts:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, "cannot write to the workspace root itself")
        with self._dir(path.parts[:-1], rel, create=True) as dfd:
            try:
                old = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(old.st_mode):
                    raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"{rel}: is a directory", path=rel)
                if stat.S_ISREG(old.st_mode):
                    mode = stat.S_IMODE(old.st_mode)
            except FileNotFoundError:
                old = None
            if self.quota is not None:
                self.quota.check_write(size, old.st_size if old is not None else 0, rel)
            tmp = f".{path.name[:200]}.{secrets.token_hex(4)}.sbx-tmp"
            try:
                fd = os.open(
                    tmp,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    mode,
                    dir_fd=dfd,
                )
            except OSError as exc:
                raise map_os_error(exc, rel) from exc
            try:
                try:
                    _write_all(fd, data)
                    os.fchmod(fd, mode)
                    if self.owner and old is None:
                        os.fchown(fd, *self.owner)
                    elif self.owner and old is not None:
                        os.fchown(fd, old.st_uid, old.st_gid)
                    os.fsync(fd)
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException as exc:
                with suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                if isinstance(exc, OSError):
                    raise map_os_error(exc, rel) from exc
                raise
            return FileStat(st.st_size, st.st_mtime_ns, st.st_mode)

    def list_files(self, path: WorkspacePath) -> list[tuple[str, FileStat]]:
        """The regular files directly in directory `path` (links and other kinds are skipped)."""
        with self._dir(path.parts, path.relative) as dfd:
            found = []
            try:
                with os.scandir(dfd) as entries:  # scandir duplicates the fd
                    for entry in entries:
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            found.append((entry.name, FileStat(st.st_size, st.st_mtime_ns, st.st_mode)))
            except OSError as exc:
                raise map_os_error(exc, path.relative) from exc
            return found

    def unlink(self, path: WorkspacePath) -> None:
        """Remove a file (or a link itself, never its target)."""
        with self._dir(path.parts[:-1], path.relative) as dfd:
            try:
                os.unlink(path.name, dir_fd=dfd)
            except OSError as exc:
                raise map_os_error(exc, path.relative) from exc
