"""The per-file write lock: one writer at a time, across tasks and processes, and nothing left
behind (a tenant writing a million distinct paths must not leave a million lock files or locks)."""

from __future__ import annotations

import fcntl
import hashlib
import multiprocessing
import os
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs import locks
from sandbox.fs.locks import file_lock


def test_many_distinct_files_leave_no_lock_files_and_no_locks(tmp_path: Path) -> None:
    async def main() -> None:
        for i in range(500):
            async with file_lock(tmp_path / "locks", f"/ws/file-{i}"):
                assert len(list((tmp_path / "locks").iterdir())) == 1  # held: it exists

    anyio.run(main)
    assert list((tmp_path / "locks").iterdir()) == []
    assert locks._local == {}


def test_tasks_of_one_process_take_turns(tmp_path: Path) -> None:
    inside = 0
    most = 0

    async def writer() -> None:
        nonlocal inside, most
        for _ in range(20):
            async with file_lock(tmp_path, "/ws/same"):
                inside += 1
                most = max(most, inside)
                await anyio.lowlevel.checkpoint()
                inside -= 1

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(writer)

    anyio.run(main)
    assert most == 1
    assert locks._local == {}
    assert list(tmp_path.iterdir()) == []


def _hold_many(lock_dir: str, marker: str, rounds: int, failures: multiprocessing.Queue[str]) -> None:
    """In a child process: take the lock `rounds` times; inside, own an O_EXCL marker file (a
    second holder at the same time finds it there)."""

    async def main() -> None:
        for _ in range(rounds):
            async with file_lock(Path(lock_dir), "/ws/contended"):
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    failures.put("two holders at once")
                    continue
                os.close(fd)
                await anyio.lowlevel.checkpoint()
                os.unlink(marker)

    anyio.run(main)


def test_processes_never_hold_it_together_though_its_file_is_unlinked_each_time(tmp_path: Path) -> None:
    # the unlink on release is the race: a waiter holding the unlinked file must not go on
    ctx = multiprocessing.get_context("fork")
    failures: multiprocessing.Queue[str] = ctx.Queue()
    marker = str(tmp_path / "inside")
    children = [ctx.Process(target=_hold_many, args=(str(tmp_path / "locks"), marker, 150, failures)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert found == []
    assert list((tmp_path / "locks").iterdir()) == []


def test_a_lock_another_process_holds_is_a_conflict_after_the_timeout(tmp_path: Path) -> None:
    seen: list[SandboxError] = []

    async def main() -> None:
        async with file_lock(tmp_path, "/ws/held"):
            path = next(tmp_path.iterdir())
        # another process holds the file at the path (as an older version left it, or mid-write)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            with pytest.raises(SandboxError) as caught:
                async with file_lock(tmp_path, "/ws/held", timeout_s=0.1):
                    pass
            seen.append(caught.value)
        finally:
            os.close(fd)
        async with file_lock(tmp_path, "/ws/held", timeout_s=1):  # free again: taken, and cleaned
            pass

    anyio.run(main)
    assert seen[0].code == ErrorCode.CONFLICT
    assert list(tmp_path.iterdir()) == []
    assert locks._local == {}


def test_a_waiter_cancelled_leaves_nothing(tmp_path: Path) -> None:
    fds_before = len(os.listdir("/proc/self/fd"))

    async def waiter() -> None:
        with anyio.move_on_after(0.05):
            async with file_lock(tmp_path, "/ws/x"):
                raise AssertionError("taken while held")

    async def main() -> None:
        async with file_lock(tmp_path, "/ws/x"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
            assert len(locks._local) == 1  # the holder's entry stays while it holds

    anyio.run(main)
    assert locks._local == {}
    assert list(tmp_path.iterdir()) == []
    assert len(os.listdir("/proc/self/fd")) == fds_before  # no fd left open by a try


def test_a_leftover_lock_file_is_used_and_then_removed(tmp_path: Path) -> None:
    async def main() -> None:
        async with file_lock(tmp_path, "/ws/old"):
            name = next(tmp_path.iterdir()).name
        (tmp_path / name).write_text("")  # left by an older version, or a process that died holding it
        async with file_lock(tmp_path, "/ws/old"):
            assert [p.name for p in tmp_path.iterdir()] == [name]

    anyio.run(main)
    assert list(tmp_path.iterdir()) == []


def test_sweep_removes_the_lock_files_nobody_holds(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.lock").write_text("")
    (tmp_path / "not-a-lock").write_text("")
    held = os.open(tmp_path / "b.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert locks.sweep(tmp_path) == 2
    finally:
        os.close(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.lock", "not-a-lock"]
    assert locks.sweep(tmp_path / "missing") == 0


def test_a_link_planted_at_a_lock_files_path_is_never_followed(tmp_path: Path) -> None:
    """A symlink where a lock file goes (to a file of someone else's, or to nothing yet): taking
    the lock fails closed, the file behind the link is neither written, truncated, locked nor
    created, and the sweep leaves it alone."""
    locks_at = tmp_path / "locks"
    locks_at.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o644)
    name = hashlib.sha256(b"/ws/a").hexdigest()[:24]
    (locks_at / f"{name}.lock").symlink_to(victim)
    missing = tmp_path / "made-through-a-link"
    other = hashlib.sha256(b"/ws/b").hexdigest()[:24]
    (locks_at / f"{other}.lock").symlink_to(missing)

    async def take(key: str) -> None:
        async with file_lock(locks_at, key, timeout_s=1):
            pytest.fail("locked through a link")

    for key in ("/ws/a", "/ws/b"):
        with pytest.raises(OSError):
            anyio.run(take, key)
    assert victim.read_text() == "precious" and victim.stat().st_mode & 0o777 == 0o644
    assert not missing.exists()
    held = os.open(victim, os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody left it locked
    finally:
        os.close(held)
    assert locks.sweep(locks_at) == 0
    assert sorted(p.name for p in locks_at.iterdir()) == sorted([f"{name}.lock", f"{other}.lock"])
    assert locks._local == {}
