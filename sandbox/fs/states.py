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


class FileStates:
    """Per-session memory of file versions, so `edit` can refuse to clobber a change it never saw.

    Args:
        path: the JSON file for one session.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: dict[str, Seen] | None = None
        self._version: tuple[int, int, int] | None = None  # the file as last read or written here

    def _file_version(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self) -> dict[str, Seen]:
        # read again when another writer changed the file (another process on the state dir, or
        # another handle of the session): a map kept from before would drop its entries
        version = self._file_version()
        if self._seen is None or version != self._version:
            try:
                raw = json.loads(self.path.read_text())
                self._seen = {k: Seen(v["sha256"], int(v["mtime_ns"])) for k, v in raw.items()}
            except (OSError, ValueError, KeyError, TypeError):
                self._seen = {}
            self._version = version
        return self._seen

    async def get(self, key: str) -> Seen | None:
        """What this session last saw of `key`."""
        return self._load().get(key)

    async def record(self, key: str, data: bytes, mtime_ns: int) -> None:
        """Remember `data` as the version this session knows."""
        seen = self._load()
        new = Seen(digest(data), mtime_ns)
        if seen.get(key) == new:
            return  # a file read again unchanged: nothing to write (it cost ~0.8 ms a call)
        seen[key] = new
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own: another holder (a handle, a process) may write at the same moment
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            tmp.write_text(json.dumps({k: {"sha256": v.sha256, "mtime_ns": v.mtime_ns} for k, v in seen.items()}))
            st = tmp.stat()  # the version is the file this holder wrote (a rename keeps it), not
            tmp.replace(self.path)  # whatever another holder put there right after
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._version = (st.st_ino, st.st_mtime_ns, st.st_size)
