"""When each sandbox was last used, kept in the state dir (labels are immutable): what `prune`'s
idle rule and `sandbox list` read.

Written off the event loop, in one worker thread, batched: the file holds every sandbox's time,
so rewriting it on the loop cost a new session's first call 0.6 ms here, and grows with the
number of sandboxes. A time not yet on disk is still in :meth:`LastUsed.read`; one lost in a
crash (written within milliseconds) costs only an older "last used" for prune's idle rule."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from sandbox._log import logger

# one thread for the process: the writes are small, and their order per file is kept
_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="last-used")


class LastUsed:
    """The last-use times of one state dir's sandboxes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        # name -> (removed?, ISO time of the use or of the removal), not yet written
        self._pending: dict[str, _Change] = {}
        self._writing: dict[str, _Change] = {}  # taken by the write under way (read still sees them)

    def read(self) -> dict[str, str]:
        """Container name -> ISO time of last use (what is on disk, and what is about to be)."""
        with self._lock:
            unwritten = {**self._writing, **self._pending}
        return _applied(self._on_disk(), unwritten)

    def touch(self, name: str) -> None:
        """Record `name` as used now; written soon, in the background."""
        self._queue(name, (False, _now()))

    def forget(self, name: str) -> None:
        """`name`'s sandbox was removed: its time goes from the file (a month of sessions would
        otherwise leave one line each, and every write rewrites them all). Only a time from
        before the removal goes: another process may have made a sandbox of that name since."""
        self._queue(name, (True, _now()))

    def _queue(self, name: str, value: _Change) -> None:
        with self._lock:
            first = not self._pending
            self._pending[name] = value
        if first:  # one write takes everything pending when it runs
            try:
                _WRITER.submit(self._write)
            except RuntimeError:  # the interpreter is shutting down: no more threads
                self._write()

    def flush(self) -> None:
        """Write what is pending, and wait for it (on the writer's thread: two writes of one file
        at once would lose one's names)."""
        try:
            _WRITER.submit(self._write).result()
        except RuntimeError:
            self._write()

    def _on_disk(self) -> dict[str, str]:
        try:
            data = json.loads(self._path.read_text())
            return {str(k): str(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _write(self) -> None:
        with self._lock:
            self._writing, self._pending = {**self._writing, **self._pending}, {}
            taken = dict(self._writing)
        if not taken:
            return
        try:
            data = _applied(self._on_disk(), taken)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self._path)
        except OSError as exc:  # a full disk: the times stay approximate, the calls go on
            logger.bind(path=str(self._path)).warning("last_used_not_written", error=str(exc))
        finally:
            with self._lock:
                self._writing = {}


_Change = tuple[bool, str]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _applied(data: dict[str, str], changes: dict[str, _Change]) -> dict[str, str]:
    """`data` with touches set, and the times of removed sandboxes dropped when they are older
    than the removal."""
    out = dict(data)
    for name, (removed, at) in changes.items():
        if not removed:
            out[name] = at
        elif name in out and not _later(out[name], at):
            del out[name]
    return out


def _later(time: str, than: str) -> bool:
    """Whether ISO time `time` is after `than` (an unreadable time is not)."""
    try:
        return datetime.fromisoformat(time) > datetime.fromisoformat(than)
    except ValueError:
        return False
