"""SQLite files on disk (the journal's, the session registry's, the state store's): private to the
orchestrator's user, never through a link, in WAL mode even when several processes make one at once."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

SQLITE_BUSY = 5


def private_files(path: Path) -> None:
    """The state dir 0700, the database and its -wal/-shm files 0600 (they hold every call's arguments).

    SQLite gives the -wal and -shm files the database file's mode, so creating the database
    0600 before SQLite opens it covers files made later; existing ones are tightened by path.
    An existing file is never opened here: closing any descriptor of a file drops every POSIX
    lock this process holds on it, SQLite's included, and another process then resets the
    shared-memory index under SQLite's feet (SIGBUS, "locking protocol").
    """
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_uid == os.geteuid():  # a directory someone else owns is left alone
        directory.chmod(0o700)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    for name in (str(path), f"{path}-wal", f"{path}-shm"):
        try:
            info = os.lstat(name)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            raise OSError(errno.ELOOP, "the journal or one of its files is a symbolic link", name)
        if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) != 0o600 and info.st_uid == os.geteuid():
            os.chmod(name, 0o600)


def use_wal(db: sqlite3.Connection, wait_s: float) -> None:
    """Put the file in WAL mode, trying again for `wait_s` while another process holds it.

    SQLite can answer SQLITE_BUSY to the switch without waiting its busy timeout while another
    connection is switching the same new file: several processes opening one new journal at the
    same moment (a journal already in WAL mode stays so, and its switch takes no lock). Each try
    may still wait the connection's own busy timeout, so the worst case is about twice `wait_s`.
    """
    busy = retry_if_exception(
        lambda exc: (
            isinstance(exc, sqlite3.OperationalError) and getattr(exc, "sqlite_errorcode", 0) & 0xFF == SQLITE_BUSY
        )
    )
    wait = wait_random_exponential(multiplier=0.002, max=0.05)
    for attempt in Retrying(retry=busy, stop=stop_after_delay(wait_s), wait=wait, reraise=True):
        with attempt:
            db.execute("PRAGMA journal_mode=WAL")
