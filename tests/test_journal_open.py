"""Opening a SQLite file of ours: several processes making one new file at the same moment all open it
(the journal, the session registry, the state store)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox._sqlite_files import use_wal
from sandbox.journal.store import Journal
from sandbox.sessions.registry import Registry
from sandbox.state.sqlite.store import connect

OPENERS = {
    "journal": lambda path: Journal(path).close(),
    "session registry": lambda path: Registry(path).close(),
    "state store": lambda path: connect(path).close(),
}


class AnswersBusy:
    """A connection whose journal-mode switch answers SQLITE_BUSY `times` times (the fault),
    as SQLite does while another process is switching the same new file."""

    def __init__(self, times: int, code: int = 5) -> None:
        self.times, self.code, self.calls = times, code, 0

    def execute(self, sql: str) -> None:
        assert sql == "PRAGMA journal_mode=WAL"
        self.calls += 1
        if self.calls <= self.times:
            exc = sqlite3.OperationalError("database is locked")
            exc.sqlite_errorcode = self.code
            raise exc


def test_a_busy_switch_is_tried_again_until_it_succeeds() -> None:
    db = AnswersBusy(times=3)
    use_wal(db, wait_s=5.0)  # type: ignore[arg-type]
    assert db.calls == 4


def test_a_switch_busy_past_the_wait_fails_with_sqlites_error() -> None:
    db = AnswersBusy(times=10**9)
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        use_wal(db, wait_s=0.2)  # type: ignore[arg-type]
    assert db.calls > 1
    assert time.monotonic() - started < 5  # bounded by the wait, not the attempts


def test_an_error_other_than_busy_is_not_tried_again() -> None:
    db = AnswersBusy(times=1, code=26)  # SQLITE_NOTADB: waiting cannot help
    with pytest.raises(sqlite3.OperationalError):
        use_wal(db, wait_s=5.0)  # type: ignore[arg-type]
    assert db.calls == 1


def _open(kind: str, path: str, start: float, results: Any) -> None:
    while time.time() < start:  # all processes reach SQLite in the same millisecond
        pass
    try:
        OPENERS[kind](Path(path))
        results.put("opened")
    except Exception as exc:
        results.put(repr(exc))


@pytest.mark.slow  # 20 processes
@pytest.mark.parametrize("kind", sorted(OPENERS))
def test_four_processes_open_one_new_file_at_once(kind: str, tmp_path: Path) -> None:
    """The race CI once lost (1 in ~100 rounds for the journal before the fix): every process opens it."""
    context = multiprocessing.get_context("fork")
    outcomes: list[str] = []
    for round_ in range(5):
        path = tmp_path / f"{round_}" / "file.db"
        results = context.Queue()
        start = time.time() + 0.1
        processes = [context.Process(target=_open, args=(kind, str(path), start, results)) for _ in range(4)]
        for process in processes:
            process.start()
        outcomes += [results.get(timeout=30) for _ in processes]
        for process in processes:
            process.join(timeout=30)
    assert outcomes == ["opened"] * 20


def test_an_extended_busy_code_is_tried_again() -> None:
    db = AnswersBusy(times=2, code=5 | (2 << 8))  # SQLITE_BUSY_SNAPSHOT: busy all the same
    use_wal(db, wait_s=5.0)  # type: ignore[arg-type]
    assert db.calls == 3


@pytest.mark.parametrize("kind", sorted(OPENERS))
@pytest.mark.parametrize("suffix", ["", "-wal", "-shm"])
def test_a_link_planted_at_one_of_its_files_is_refused_and_its_target_untouched(
    kind: str, suffix: str, tmp_path: Path
) -> None:
    """A symbolic link at the database, its -wal or its -shm path (planted by whoever could write
    the state dir) is never followed: opening fails naming the file, and the file the link points
    at keeps its bytes and its mode (SQLite would have written every call's arguments into it)."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me\n")
    victim.chmod(0o644)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / f"file.db{suffix}").symlink_to(victim)
    with pytest.raises(Exception) as info:
        OPENERS[kind](state / "file.db")
    assert f"file.db{suffix}" in str(info.value) and "symbolic link" in str(info.value), info.value
    assert victim.read_bytes() == b"keep me\n" and victim.stat().st_mode & 0o777 == 0o644
    assert (state / f"file.db{suffix}").is_symlink()
