"""One writer at a time per file: an in-process lock plus an flock for other processes.

Neither outlives its use. A tenant that writes a million distinct paths must not leave a
million lock files in the state dir, nor a million locks in the orchestrator's memory: the
lock file is unlinked by its holder before it unlocks, and the in-process lock is dropped when
its last user leaves. An unlinked lock file is why a taker checks, once it holds the flock,
that the path still names the file it locked (else it locked a file nobody else will find, and
takes the lock again).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from sandbox.errors import ErrorCode, SandboxError

POLL_S = 0.01  # how often a lock another process holds is tried again


def lock_dir(state_dir: Path) -> Path:
    """Where the file locks of one state dir live."""
    return state_dir / "locks"


@dataclass
class _Local:
    lock: anyio.Lock
    users: int = 0  # holders and waiters: the entry goes with the last of them


_local: dict[str, _Local] = {}


@asynccontextmanager
async def file_lock(lock_dir: Path, key: str, timeout_s: float = 10.0) -> AsyncIterator[None]:
    """Hold the write lock of `key` (a host path) for the duration of the block.

    Raises:
        SandboxError: CONFLICT when the lock is not free within `timeout_s`.
    """
    name = hashlib.sha256(key.encode()).hexdigest()[:24]
    entry = _local.get(name)
    if entry is None:
        entry = _local[name] = _Local(anyio.Lock())
    entry.users += 1
    try:
        with anyio.move_on_after(timeout_s) as scope:
            await entry.lock.acquire()
        if scope.cancelled_caught:
            raise SandboxError(ErrorCode.CONFLICT, "another call is writing this file; try again", retryable=True)
        try:
            # a few syscalls on the orchestrator's own folder: cheaper on the loop than a thread hop
            fd = await _take_file(lock_dir / f"{name}.lock", anyio.current_time() + timeout_s)
            try:
                yield
            finally:
                _release_file(lock_dir / f"{name}.lock", fd)
        finally:
            entry.lock.release()
    finally:
        entry.users -= 1
        if entry.users == 0 and _local.get(name) is entry:
            del _local[name]


async def _take_file(path: Path, deadline: float) -> int:
    """An fd of `path` holding its flock, `path` still naming it (its last holder may have
    unlinked it while we waited).

    Raises:
        SandboxError: CONFLICT when another process holds it past `deadline`.
    """
    while True:
        fd = _open(path)
        try:
            while not _try_flock(fd):
                if anyio.current_time() > deadline:
                    raise SandboxError(ErrorCode.CONFLICT, "another process is writing this file; try again")
                await anyio.sleep(POLL_S)
            if _names(path, fd):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # locked a file its holder had unlinked: take the one at the path now


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except FileNotFoundError:  # the lock folder is made on first use
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _names(path: Path, fd: int) -> bool:
    """Whether `path` is the file open as `fd`."""
    try:
        at = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (at.st_dev, at.st_ino) == (held.st_dev, held.st_ino)


def _release_file(path: Path, fd: int) -> None:
    """Unlink the lock file while it is still held (a waiter then sees it gone), then let go."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def sweep(lock_dir: Path) -> int:
    """Remove the lock files nobody holds (left by a process that died holding one, or by
    versions that kept them); how many went. Blocking: run it off the event loop."""
    removed = 0
    try:
        names = [e.name for e in os.scandir(lock_dir) if e.name.endswith(".lock")]
    except FileNotFoundError:
        return 0
    for name in names:
        path = lock_dir / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or not a plain file of ours
        try:
            # the holder's protocol: held and still at its path, then unlinked before the unlock
            if _try_flock(fd) and _names(path, fd):
                os.unlink(path)
                removed += 1
        finally:
            os.close(fd)
    return removed
