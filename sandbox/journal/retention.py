"""Retention: the journal keeps `journal.retention.max_age` of history in at most `max_bytes`.

Pruning deletes events past `max_age`, then, over `max_bytes`, the oldest events of the tenants
that hold the most (journal/size_prune.py: one tenant's flood pushes out its own history, not its
neighbours'), in small batches (each its own short transaction, so the writer thread and other
processes wait milliseconds, not the whole prune; journal/prune_steps.py), and never an event of
a call that is still open (its owner may be running it, or recovery must settle it) nor of a
call waiting for approval. Decided approvals and loop-detection rows older than the oldest event
kept go with them: a session's calls, and its breaker by the time it tripped (or was reset), so
a tripped breaker lasts `max_age`, not for good.

Space: SQLite keeps deleted pages in the file for reuse. A journal made since schema version 2
uses `auto_vacuum=INCREMENTAL`, so a prune hands the pages back to the file system in small
steps (`PRAGMA incremental_vacuum`), never one long lock. An older journal (`auto_vacuum=NONE`)
reuses its free pages, so it stops growing, but shrinks only after one `VACUUM`
(`sandbox journal prune --vacuum`, which converts it; the service never runs a VACUUM: it
holds the write lock for as long as the whole file takes to copy).
"""

from __future__ import annotations

import functools
import math
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from threading import Event
from typing import TYPE_CHECKING

import anyio.to_thread

from sandbox._log import logger
from sandbox.errors import SandboxError
from sandbox.journal.prune_steps import PruneJob, PruneStopped, Run, pragma
from sandbox.journal.size_prune import delete_to_size

if TYPE_CHECKING:
    from sandbox.config.models import RetentionConfig
    from sandbox.journal.store import Journal


CHECKPOINT_WAIT_MS = 100  # how long the final checkpoint may hold writers off waiting for readers
VACUUM_CHECKPOINT_WAIT_MS = 2000
VACUUM_STEP_PAGES = 512  # pages handed back per step (2 MiB at SQLite's default page size: ~25 ms)
LOW_WATER = 0.9  # a size prune goes this far under the bound, so the next write does not prune again
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_UNITS = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}

# the oldest events that no open call and no pending approval needs, by the time index
DELETE_OLDEST = (
    "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE ts < ? "
    "AND call_id NOT IN (SELECT call_id FROM open_calls) "
    "AND call_id NOT IN (SELECT call_id FROM approvals WHERE status = 'pending') "
    "ORDER BY ts LIMIT ?)"
)
# a decided approval of a call still open stays: its call is running (or recovery settles it)
DELETE_DECIDED = (
    "DELETE FROM approvals WHERE rowid IN (SELECT rowid FROM approvals WHERE status != 'pending' "
    "AND created < ? AND call_id NOT IN (SELECT call_id FROM open_calls) LIMIT ?)"
)
DELETE_LOOP_ROWS = "DELETE FROM loop_calls WHERE id IN (SELECT id FROM loop_calls WHERE ts < ? ORDER BY id LIMIT ?)"
# a breaker tripped (or reset) before the horizon: its session's calls of then are gone too, so a
# reset's mark hides nothing any more, and a breaker is not kept for good (one per tripped session)
DELETE_LOOP_SESSIONS = "DELETE FROM loop_sessions WHERE rowid IN (SELECT rowid FROM loop_sessions WHERE ts < ? LIMIT ?)"
# a breaker with no time (0: tripped by a process of the version before, still running beside
# this one through an upgrade) counts from the first prune that sees it, never as long past
DATE_UNKNOWN_BREAKERS = "UPDATE loop_sessions SET ts = ? WHERE ts = 0"


@dataclass(frozen=True)
class Retention:
    """Bounds in numbers: seconds of history and bytes of file (None: no bound)."""

    max_age_s: float | None
    max_bytes: int | None
    every_s: float = 300.0

    @classmethod
    def of(cls, config: RetentionConfig) -> Retention:
        """The bounds a `journal.retention` section states."""
        return cls(parse_age(config.max_age), parse_bytes(config.max_bytes), config.check_every_s)


@dataclass(frozen=True)
class PruneReport:
    """What one prune did."""

    events_deleted: int
    approvals_deleted: int
    loop_rows_deleted: int
    bytes_before: int
    bytes_after: int
    auto_vacuum: str  # incremental | none (free pages reused, file not shrunk) | full
    vacuumed: bool  # a full VACUUM ran (it converted the journal to incremental)
    kept_open: int  # open calls whose events were kept whatever their age
    seconds: float
    stopped: bool = False  # the stop flag ended it midway (the service shutting down)


def parse_age(text: str) -> float | None:
    """`30d`, `12h`, `2w` -> seconds; `0` -> None (no bound)."""
    found = re.fullmatch(r"(\d+)([smhdw])", text)
    if found is None:
        return None
    seconds = int(found.group(1)) * _UNITS[found.group(2)]
    return float(seconds) if seconds else None


def parse_bytes(text: str) -> int | None:
    """`2g`, `500m`, `4096` -> bytes; `0` -> None (no bound)."""
    last = text[-1:].lower()
    size = int(text[:-1]) * _SIZE_UNITS[last] if last in _SIZE_UNITS else int(text)
    return size or None


def file_bytes(path: Path) -> int:
    """The journal's bytes on disk: the database and its write-ahead log."""
    total = 0
    for name in (str(path), f"{path}-wal"):
        try:
            total += os.stat(name).st_size
        except FileNotFoundError:
            continue
    return total


def prune(
    run: Run, look: Run, path: Path, retention: Retention, *, now: float, vacuum: bool, stop: Event | None = None
) -> PruneReport:
    """Apply `retention` to the journal at `path` (see the module's docstring).

    Args:
        run: runs a write step under the journal's write lock (deletes, vacuum steps).
        look: runs a step on a connection of the prune's own (counts, sizes, the checkpoint):
            neither holds the write lock nor waits for the journal's readers.
        stop: once set, the prune ends before its next step (at most one batch later) and
            reports `stopped`.
    """
    started = time.monotonic()
    before = file_bytes(path)
    job = PruneJob(run, look, stop)
    mode, vacuumed, stopped, kept = "none", False, False, 0
    try:
        if retention.max_age_s is not None:
            job.delete_batches(DELETE_OLDEST, (now - retention.max_age_s,), "events")
        if retention.max_bytes is not None:
            delete_to_size(job, int(retention.max_bytes * LOW_WATER))  # the largest tenants first
        horizon = oldest_kept(job, now, retention)
        job.delete_batches(DELETE_DECIDED, (horizon,), "approvals")
        job.delete_batches(DELETE_LOOP_ROWS, (horizon,), "loop_rows")
        if retention.max_age_s is not None:
            # by age alone: the size bound's horizon moves with the events a tenant writes, and a
            # flood of them must not un-trip its own breaker early (the rows are tiny)
            job.paced(run, lambda db: db.execute(DATE_UNKNOWN_BREAKERS, (now,)).rowcount)
            job.delete_batches(DELETE_LOOP_SESSIONS, (now - retention.max_age_s,), "loop_rows")
        mode = ("none", "full", "incremental")[look(lambda db: pragma(db, "auto_vacuum"))]
        if vacuum and mode != "incremental":
            run(_vacuum_into_incremental)  # the CLI's, on request: no rest after it
            mode, vacuumed = "incremental", True
        elif mode == "incremental":
            while look(lambda db: pragma(db, "freelist_count")):
                job.paced(run, _vacuum_step)
        # after a VACUUM the whole file is in the log: worth waiting longer for readers to empty it
        wait_ms = VACUUM_CHECKPOINT_WAIT_MS if vacuumed else CHECKPOINT_WAIT_MS
        for _ in range(5):  # a busy log (a reader mid-snapshot) is tried again shortly
            if not job.paced(look, functools.partial(_truncate_wal, wait_ms)):
                break
        kept = look(lambda db: int(db.execute("SELECT COUNT(*) FROM open_calls").fetchone()[0]))
    except PruneStopped:
        stopped = True
    done, seconds = job.deleted, time.monotonic() - started
    after = file_bytes(path)
    report = PruneReport(
        done["events"], done["approvals"], done["loop_rows"], before, after, mode, vacuumed, kept, seconds, stopped
    )
    logger.bind(**report.__dict__).info("journal_prune_stopped" if stopped else "journal_pruned")
    return report


async def keep_journal_bounded(journal: Journal | None, config: RetentionConfig) -> None:
    """Prune `journal` now and every `check_every_s`, off the event loop, for as long as this runs.

    For the service's lifespan (run it in its task group); a prune that fails is logged and
    tried again next time. Cancelled (the service stopping), it returns at once and sets the
    running prune's stop flag: its thread ends at most one batch later (:meth:`Journal.close`
    waits for that batch, never for the whole prune).
    """
    if journal is None:
        return
    retention = Retention.of(config)
    if retention.max_age_s is None and retention.max_bytes is None:
        return
    warned = False
    stop = Event()
    while True:
        try:
            # abandoned on cancel (a worker thread cannot be interrupted): the flag then ends
            # the prune at most one batch later, so a shutdown never waits for a whole prune
            report = await anyio.to_thread.run_sync(
                functools.partial(journal.prune, retention, stop=stop), abandon_on_cancel=True
            )
            if report.auto_vacuum == "none" and retention.max_bytes is not None and not warned:
                warned = True  # once per start: the fix is one command, run by the operator
                logger.bind(path=str(journal.path)).warning(
                    "journal_needs_vacuum: free pages are reused but the file does not shrink until "
                    "`sandbox journal prune --vacuum` runs once"
                )
        except SandboxError as exc:
            logger.bind(reason=exc.message).warning("journal_prune_failed")
        except BaseException:  # cancelled (the service stopping): the thread stops at its next step
            stop.set()
            raise
        await anyio.sleep(retention.every_s)


def oldest_kept(job: PruneJob, now: float, retention: Retention) -> float:
    """Rows of the other tables older than this go: the age bound, or the oldest event kept."""
    oldest = job.look(lambda db: db.execute("SELECT ts FROM events ORDER BY ts LIMIT 1").fetchone())
    age = now - retention.max_age_s if retention.max_age_s is not None else -math.inf
    if retention.max_bytes is None or oldest is None:
        return age
    return max(age, float(oldest[0]))


def _vacuum_step(db: sqlite3.Connection) -> int:
    # executescript steps the pragma to its end; execute() would free one page per call
    db.executescript(f"PRAGMA incremental_vacuum({VACUUM_STEP_PAGES});")
    return 1


def _vacuum_into_incremental(db: sqlite3.Connection) -> int:
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("VACUUM")
    return 1


def _truncate_wal(wait_ms: int, db: sqlite3.Connection) -> int:
    # on the prune's own connection, outside the write lock. TRUNCATE holds SQLite's write lock
    # while it waits for readers: only briefly (busy timeout lowered); a reader still busy then
    # leaves the log for the next checkpoint (journal_size_limit caps it)
    timeout = int(db.execute("PRAGMA busy_timeout").fetchone()[0])
    db.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
    try:
        busy = int(db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0])
    finally:
        db.execute(f"PRAGMA busy_timeout = {timeout}")
    return busy
