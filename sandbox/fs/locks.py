"""One writer at a time per file: an in-process lock plus an flock for other processes."""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread

from sandbox.errors import ErrorCode, SandboxError

_local: dict[str, anyio.Lock] = {}


def _open_lock_file(lock_dir: Path, name: str) -> int:
    lock_dir.mkdir(parents=True, exist_ok=True)
    return os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


@asynccontextmanager
async def file_lock(lock_dir: Path, key: str, timeout_s: float = 10.0) -> AsyncIterator[None]:
    """Hold the write lock of `key` (a host path) for the duration of the block.

    Raises:
        SandboxError: CONFLICT when the lock is not free within `timeout_s`.
    """
    name = hashlib.sha256(key.encode()).hexdigest()[:24]
    lock = _local.setdefault(name, anyio.Lock())
    with anyio.move_on_after(timeout_s) as scope:
        await lock.acquire()
    if scope.cancelled_caught:
        raise SandboxError(ErrorCode.CONFLICT, "another call is writing this file; try again", retryable=True)
    try:
        fd = await anyio.to_thread.run_sync(_open_lock_file, lock_dir, name)
        try:
            deadline = anyio.current_time() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if anyio.current_time() > deadline:
                        raise SandboxError(
                            ErrorCode.CONFLICT, "another process is writing this file; try again"
                        ) from None
                    await anyio.sleep(0.01)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        lock.release()
