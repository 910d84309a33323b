"""A prune's steps: short transactions, each followed by a rest, that a stop flag can end.

Shared by the age bound (journal/retention.py) and the size bound (journal/size_prune.py);
:func:`in_batches` and :func:`in_batches_async` also serve the sessions registry's prune and the
PostgreSQL store's (one delete of a bounded batch at a time, never one long transaction).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from threading import Event
from typing import Protocol, TypeVar

import anyio

T = TypeVar("T")
BATCH_ROWS = 1000  # rows per delete transaction: milliseconds to tens of them at a million rows
# after each batch the prune rests at least as long as the batch took (and this long): writers
# (the service's writer thread, other processes) always find the lock free about half the time
PAUSE_S = 0.005


class Run(Protocol):
    """Runs one step on a connection of the journal: the write connection under its lock (a
    short transaction), or the prune's own (counts, sizes, the checkpoint)."""

    def __call__(self, step: Callable[[sqlite3.Connection], T], /) -> T: ...


class PruneStopped(Exception):  # a signal caught by prune(), not an error anyone sees
    """Raised between two steps of a prune once its stop flag is set (or the journal closed)."""


class PruneJob:
    """One prune's steps and what they deleted so far (kept when it is stopped midway)."""

    def __init__(self, run: Run, look: Run, stop: Event | None) -> None:
        self.run, self.look, self.stop = run, look, stop
        self.deleted = {"events": 0, "approvals": 0, "loop_rows": 0}

    def paced(self, run: Run, step: Callable[[sqlite3.Connection], T]) -> T:
        """One step, then a rest as long as it took: a prune never starves writers.

        Raises:
            PruneStopped: the stop flag was set before the step.
        """
        if self.stop is not None and self.stop.is_set():
            raise PruneStopped
        started = time.monotonic()
        done = run(step)
        time.sleep(max(PAUSE_S, time.monotonic() - started))
        return done

    def delete_batches(self, sql: str, args: tuple[object, ...], what: str) -> None:
        """Run `sql` (a DELETE of at most `?` rows, its last parameter) until a batch falls short."""

        def batch(rows: int) -> int:
            done = self.paced(self.run, lambda db: int(db.execute(sql, (*args, rows)).rowcount))
            self.deleted[what] += done  # counted as it goes: a stopped prune reports what it did
            return done

        in_batches(batch, BATCH_ROWS)


def in_batches(delete: Callable[[int], int], rows: int) -> int:
    """Call `delete(rows)` (it deletes at most that many, each call its own short transaction, and
    says how many went) until a call deletes fewer; how many went in all."""
    total = 0
    while True:
        done = delete(rows)
        total += done
        if done < rows:
            return total


async def in_batches_async(delete: Callable[[int], Awaitable[int]], rows: int, *, pause_s: float = 0.0) -> int:
    """:func:`in_batches` for a delete that is awaited, resting `pause_s` between two batches (so
    writers and readers get the table)."""
    total = 0
    while True:
        done = await delete(rows)
        total += done
        if done < rows:
            return total
        if pause_s:
            await anyio.sleep(pause_s)


def pragma(db: sqlite3.Connection, name: str) -> int:
    """An integer pragma's value."""
    return int(db.execute(f"PRAGMA {name}").fetchone()[0])


def used_bytes(db: sqlite3.Connection) -> int:
    """The bytes of the pages in use (the file less its free pages)."""
    return (pragma(db, "page_count") - pragma(db, "freelist_count")) * pragma(db, "page_size")
