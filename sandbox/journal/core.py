"""What the journal's stores share: one writing connection, its lock, the writer thread, the reads.

:class:`~sandbox.journal.store.Journal` is that core and the facade; the approval store
(approvals.py) and the loop-history store (loops.py) are held by it and write through it, so
every write, theirs included, goes in order on the one connection under the one lock.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sandbox.journal.writer import Writer


class JournalCore(Protocol):
    """The journal's connection, lock and writer, as its stores use them."""

    path: Path
    _lock: threading.Lock
    _db: sqlite3.Connection
    _writer: Writer

    def _read(self, sql: str, args: tuple[Any, ...], *, flush: bool = True) -> list[tuple[Any, ...]]:
        """Rows of a query, after whatever is queued is written (unless `flush` is False)."""
        ...

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        """One write, in order after whatever is queued."""
        ...
