"""Command output with bounded memory: a head and a tail per stream, the whole of it on disk.

A sandbox can print gigabytes. Holding that in the orchestrator's memory (as a list of chunks,
then joined, then decoded) costs several times its size, so every runtime captures output here:
up to `keep_bytes` of each stream stays in memory as it arrived; past that only the head and a
rolling tail are kept, and the full interleaved output goes to a spill file as it arrives. Past
`max_bytes` nothing more is taken at all and the capture reports `overflowed`, so the caller
stops the command.

The spill file is the host's disk, spent for a tenant: it is bounded per call (`spill_max_bytes`,
the room the tenant's quotas leave: a bigger output could not be saved where the tenant can read
it anyway) and per tenant (a :class:`SpillBudget` shared by its calls in flight, bytes reserved
before they are written), and it never outlives its call (:meth:`OutputCapture.discard`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

KEEP_BYTES = 512 * 1024  # per stream kept whole in memory before head/tail mode
CAPTURE_DIR = "outputs"  # state_dir/outputs/<tenant>/: long outputs of calls in flight


def capture_folder(state_dir: Path, tenant: str) -> Path:
    """Where a tenant's long outputs are captured while their calls run: a folder and a budget
    of its own, so one tenant's flood never takes another's room (tenant ids are plain names)."""
    return state_dir / CAPTURE_DIR / tenant


class SpillBudget:
    """Bytes a tenant's spill files may hold at once, reserved before each write (thread-safe).

    Args:
        limit: the bytes all of them may hold together.
        used: bytes already on disk when the budget was made (leftovers of a crash).
    """

    def __init__(self, limit: int, used: int = 0) -> None:
        self.limit = limit
        self.used = used
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        """Reserve `size` bytes; False (nothing reserved) when they do not fit."""
        with self._lock:
            if self.used + size > self.limit:
                return False
            self.used += size
            return True

    def give(self, size: int) -> None:
        """Hand back bytes reserved earlier (their file was removed)."""
        with self._lock:
            self.used = max(0, self.used - size)


@dataclass(frozen=True)
class Captured:
    """One stream as kept: whole, or its head and tail with the count of bytes between them."""

    head: bytes
    tail: bytes
    total: int

    @property
    def cut(self) -> int:
        """Bytes between head and tail that are not in memory."""
        return self.total - len(self.head) - len(self.tail)

    @property
    def whole(self) -> bytes | None:
        """The stream's bytes when nothing was cut, else None."""
        return self.head + self.tail if self.cut == 0 else None


class _Stream:
    # The tail is a queue of whole chunks, dropped from the left: no per-chunk reallocation of
    # one growing buffer (which fragments the allocator's arenas when threads read output).
    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail.append(data)
            self.tail_size += len(data)
            while self.tail and self.tail_size - len(self.tail[0]) >= self.keep:
                self.tail_size -= len(self.tail.popleft())

    def captured(self) -> Captured:
        tail = b"".join(self.tail)[-self.keep :] if self.tail else b""
        return Captured(bytes(self.head), tail, self.total)


class OutputCapture:
    """Collects stdout (1) and stderr (2) chunks; thread-safe (runtimes read in worker threads).

    Args:
        spill_path: where the full interleaved output is written once it outgrows memory
            (a host file only the orchestrator can reach); None keeps only head and tail.
        max_bytes: total output after which nothing more is taken (`overflowed`).
        keep_bytes: bytes per stream kept whole before head/tail mode.
        spill_max_bytes: the most the spill file may hold; past it the file is removed and the
            command goes on with head and tail only (`spill_error` says why).
        spill_budget: the tenant's budget each spilled byte is reserved from first.
    """

    def __init__(
        self,
        spill_path: Path | None = None,
        max_bytes: int | None = None,
        keep_bytes: int = KEEP_BYTES,
        *,
        spill_max_bytes: int | None = None,
        spill_budget: SpillBudget | None = None,
    ):
        self.spill_path = spill_path
        self.max_bytes = max_bytes
        self.spill_max_bytes = spill_max_bytes
        self.spill_budget = spill_budget
        self._spill_size = 0  # bytes written to the spill file (reserved from the budget)
        self._streams = {1: _Stream(keep_bytes), 2: _Stream(keep_bytes), 0: _Stream(keep_bytes)}
        self._pending: list[bytes] | None = []  # merged output until it spills
        self._pending_size = 0
        self._keep = keep_bytes
        self._file: BinaryIO | None = None
        self._lock = threading.Lock()
        self.spill_error: str | None = None
        self.overflowed = False
        self._spilled = False

    @property
    def total(self) -> int:
        """Bytes taken so far (both streams)."""
        return self._streams[0].total

    @property
    def spilled(self) -> bool:
        """Whether the full output is in the spill file (it outgrew memory and was saved whole)."""
        return self._spilled and self.spill_error is None

    def add(self, stream: int, data: bytes) -> bool:
        """Take one chunk; False once the output is over `max_bytes` (stop reading, stop the command)."""
        with self._lock:
            if self.overflowed:
                return False
            if self.max_bytes is not None and self.total + len(data) > self.max_bytes:
                data = data[: max(0, self.max_bytes - self.total)]
                self.overflowed = True
            self._streams[stream].add(data)
            self._streams[0].add(data)
            self._merged(data)
            return not self.overflowed

    def _merged(self, data: bytes) -> None:
        if self._pending is not None:
            self._pending.append(data)
            self._pending_size += len(data)
            if self._pending_size <= self._keep:
                return
            pending, self._pending = self._pending, None
            self._open_spill()
            data = b"".join(pending)
        if self._file is not None:
            if not self._reserve(len(data)):
                return
            try:
                self._file.write(data)
            except OSError as exc:
                self._spill_failed(exc)

    def _reserve(self, size: int) -> bool:
        # the room is taken before the bytes are written: concurrent calls of one tenant never
        # hold more than its budget between them
        limit = self.spill_max_bytes
        if limit is not None and self._spill_size + size > limit:
            self._spill_over(f"it is over {limit:,} bytes, the room left under the workspace quota")
            return False
        if self.spill_budget is not None and not self.spill_budget.take(size):
            budget = self.spill_budget.limit
            self._spill_over(f"the tenant's long outputs in flight would pass {budget:,} bytes")
            return False
        self._spill_size += size
        return True

    def _spill_over(self, why: str) -> None:
        self._remove_spill()
        self.spill_error = f"the full output was not saved ({why}); only its head and tail are kept"
        self.spill_path = None

    def _open_spill(self) -> None:
        if self.spill_path is None:
            return
        try:
            self.spill_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # O_EXCL|O_NOFOLLOW: a fresh file of ours, never something planted at the name
            fd = os.open(self.spill_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            self._file = os.fdopen(fd, "wb", buffering=1024 * 1024)
            self._spilled = True
        except OSError as exc:
            self._spill_failed(exc)

    def _spill_failed(self, exc: OSError) -> None:
        self.spill_error = f"the full output could not be saved ({exc.strerror or exc})"
        self._remove_spill()
        self.spill_path = None

    def _remove_spill(self) -> None:
        """Close and remove the spill file, handing its bytes back to the budget."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        if self._spilled and self.spill_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.spill_path)
        if self.spill_budget is not None:
            self.spill_budget.give(self._spill_size)
        self._spill_size = 0
        self._spilled = False

    def clear_if_from(self, taken_before: int) -> None:
        """Forget everything taken, when it was all taken since `taken_before` was 0 and none of
        it reached the spill file: the engine's words about a command that never ran, before the
        command runs elsewhere with this capture. Otherwise (earlier output, a spill) keep it all."""
        with self._lock:
            if taken_before != 0 or self._pending is None or self._file is not None or self.overflowed:
                return
            self._streams = {which: _Stream(self._keep) for which in (1, 2, 0)}
            self._pending, self._pending_size = [], 0

    def discard(self) -> None:
        """The call is over: its spill file goes (copied into the workspace by now, or not kept
        at all) and its bytes go back to the tenant's budget. Safe to call more than once."""
        with self._lock:
            self._remove_spill()

    def close(self) -> None:
        """Flush and close the spill file."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as exc:
                    self._spill_failed(exc)
                self._file = None

    def stream(self, which: int) -> Captured:
        """What is kept of stdout (1), stderr (2) or both interleaved (0)."""
        with self._lock:
            return self._streams[which].captured()

    def joined(self, which: int) -> bytes:
        """A stream as bytes: whole, or head + tail (the cut is reported by `stream`)."""
        kept = self.stream(which)
        return kept.head + kept.tail


def describe_cut(cut: int, total: int, where: str | None) -> str:
    """The marker put between the head and the tail of a long output."""
    place = f"; full output in {where}" if where else ""
    return f"\n\n[... truncated: {cut:,} of {total:,} bytes cut{place} ...]\n\n"
