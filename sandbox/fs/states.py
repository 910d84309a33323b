"""File states: what each session last saw of each file (hash, mtime), so `edit` can refuse to
clobber a change the session never saw. Kept in the session's state dir (FileStates), or in the
shared store where several replicas serve the session (SharedFileStates)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio.to_thread

from sandbox.state.protocol import SessionRecords

KIND = "file"


@dataclass(frozen=True)
class Seen:
    """A file as a session last read or wrote it."""

    sha256: str
    mtime_ns: int


def digest(data: bytes) -> str:
    """sha256 hex of file content."""
    return hashlib.sha256(data).hexdigest()


class SeenFiles(Protocol):
    """Per-session memory of file versions."""

    async def get(self, key: str) -> Seen | None:
        """What this session last saw of `key` (a file's host path)."""
        ...

    async def record(self, key: str, data: bytes, mtime_ns: int) -> None:
        """Remember `data` as the version this session knows."""
        ...


class SharedFileStates:
    """The versions as rows of the shared store, by tenant and session: an `edit` through one
    replica knows what the session read or wrote through another."""

    def __init__(self, store: SessionRecords, tenant: str, session: str) -> None:
        self.store = store
        self.tenant = tenant
        self.session = session

    async def get(self, key: str) -> Seen | None:
        """See :class:`SeenFiles`."""
        value = await self.store.session_record(self.tenant, self.session, KIND, key)
        if value is None:
            return None
        try:
            raw = json.loads(value)
            return Seen(str(raw["sha256"]), int(raw["mtime_ns"]))
        except (ValueError, KeyError, TypeError):
            return None

    async def record(self, key: str, data: bytes, mtime_ns: int) -> None:
        """See :class:`SeenFiles` (always written: another replica may have recorded another version)."""
        value = json.dumps({"sha256": digest(data), "mtime_ns": mtime_ns})
        await self.store.put_session_record(self.tenant, self.session, KIND, key, value)


MAX_SEEN = 4096  # files one session's record keeps; the oldest go (as if never read)


class FileStates:
    """Per-session memory of file versions, so `edit` can refuse to clobber a change it never saw.

    An append-only log of JSON lines (`{"k": key, "h": sha256, "t": mtime_ns}`, the last line
    of a key wins): recording a version appends one line, and a holder reads only what was
    appended since it last looked, so neither grows with the number of files a session has seen
    (rewriting the whole map on every new file cost 28 ms of the event loop at 10,000 files).
    At most MAX_SEEN files are kept; when the log holds twice that many lines it is rewritten
    whole (atomically), with only the newest MAX_SEEN. A file forgotten that way, or whose line
    another holder appended at the moment of that rewrite, is as if never read: an edit of it
    has no CONFLICT check (its `old_string` must still match the current text exactly). A file
    in the old format (one JSON object) is read once and rewritten as a log.

    Args:
        path: the file of one session.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: dict[str, Seen] = {}
        self._read_to: tuple[int, int] | None = None  # (inode, offset) of the log read so far
        self._lines = 0  # lines in the log (read or appended here)

    def _load(self) -> dict[str, Seen]:
        try:
            st = os.stat(self.path)
        except OSError:
            self._seen, self._read_to, self._lines = {}, None, 0
            return self._seen
        offset = 0
        if self._read_to is not None and self._read_to[0] == st.st_ino and st.st_size >= self._read_to[1]:
            offset = self._read_to[1]  # the same log, grown: only the new lines
        else:
            self._seen, self._lines = {}, 0  # new, replaced or cut: read from the start
        if st.st_size > offset:
            with open(self.path, "rb") as log:
                log.seek(offset)
                data = log.read()
            if offset == 0 and self._read_old_format(data):
                return self._seen
            end = data.rfind(b"\n") + 1  # whole lines only: one being appended is read next time
            for line in data[:end].splitlines():
                self._apply(line)
            offset += end
        self._read_to = (st.st_ino, offset)
        return self._seen

    def _apply(self, line: bytes) -> None:
        try:
            raw = json.loads(line)
            key, seen = str(raw["k"]), Seen(str(raw["h"]), int(raw["t"]))
        except (ValueError, KeyError, TypeError):
            return  # a damaged line: that file is asked to be read again
        self._lines += 1
        self._remember(key, seen)

    def _remember(self, key: str, seen: Seen) -> None:
        self._seen.pop(key, None)  # to the end: the newest
        self._seen[key] = seen
        while len(self._seen) > MAX_SEEN:
            del self._seen[next(iter(self._seen))]

    def _read_old_format(self, data: bytes) -> bool:
        """A file written before the log (one JSON object of key -> {sha256, mtime_ns}): read it
        and rewrite it as a log. False when `data` is not that."""
        try:
            raw = json.loads(data)
            if not (isinstance(raw, dict) and all(isinstance(v, dict) for v in raw.values())):
                return False
            for key, value in raw.items():
                self._remember(str(key), Seen(str(value["sha256"]), int(value["mtime_ns"])))
        except (ValueError, KeyError, TypeError):
            return False
        self._rewrite()
        return True

    async def get(self, key: str) -> Seen | None:
        """What this session last saw of `key`."""
        return self._load().get(key)

    async def record(self, key: str, data: bytes, mtime_ns: int) -> None:
        """Remember `data` as the version this session knows (one line appended)."""
        seen = self._load()
        new = Seen(digest(data), mtime_ns)
        if seen.get(key) == new:
            return  # a file read again unchanged: nothing to write
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"k": key, "h": new.sha256, "t": new.mtime_ns}).encode() + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)  # one write of one line: holders appending at once do not interleave
        finally:
            os.close(fd)
        # not marked as read: the next look reads from where it was (this line again, and any
        # another holder appended meanwhile)
        self._remember(key, new)
        self._lines += 1
        if self._lines > 2 * MAX_SEEN:  # once per MAX_SEEN new files: in a worker thread
            kept = list(self._seen.items())
            self._lines = len(kept)
            self._read_to = await anyio.to_thread.run_sync(_write_log, self.path, kept)

    def _rewrite(self) -> None:
        """The log rewritten whole with what is kept, here (the one-time move from the old format)."""
        self._read_to = _write_log(self.path, list(self._seen.items()))
        self._lines = len(self._seen)


def _write_log(path: Path, kept: list[tuple[str, Seen]]) -> tuple[int, int]:
    """Write `kept` as the whole log (a name of its own, then an atomic replace); its (inode, size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    body = b"".join(json.dumps({"k": k, "h": v.sha256, "t": v.mtime_ns}).encode() + b"\n" for k, v in kept)
    try:
        tmp.write_bytes(body)
        os.chmod(tmp, 0o600)
        st = tmp.stat()
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return st.st_ino, st.st_size
