"""The symlink-proof host-side walk, attacked with planted links to decoys (host only, fast)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.paths import WorkspacePath
from sandbox.fs.safe import SafeRoot


def wp(rel: str) -> WorkspacePath:
    return WorkspacePath(tuple(rel.split("/")))


@pytest.fixture
def tree(tmp_path: Path) -> tuple[SafeRoot, Path, Path]:
    ws = tmp_path / "ws"
    outside = tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "decoy.txt").write_text("DECOY\n")
    (ws / "ok.txt").write_text("fine\n")
    os.symlink(outside / "decoy.txt", ws / "file-link")
    os.symlink(outside, ws / "dir-link")
    os.symlink("/", ws / "d")
    (ws / "real").mkdir()
    return SafeRoot(ws), ws, outside


@pytest.mark.parametrize("rel", ["file-link", "dir-link/decoy.txt", "d/etc/hostname", "d/etc/passwd"])
def test_reads_through_links_refused(tree: tuple[SafeRoot, Path, Path], rel: str) -> None:
    """Reading through a file link, a directory link or a link to / is refused."""
    root, _, _ = tree
    with pytest.raises(SandboxError) as info:
        root.read_bytes(wp(rel), 1 << 20)
    assert info.value.code == ErrorCode.PERMISSION_DENIED
    assert "symbolic link" in info.value.message


@pytest.mark.parametrize("rel", ["dir-link/decoy.txt", "dir-link/new.txt", "d/tmp/planted.txt"])
def test_writes_through_parent_links_refused(tree: tuple[SafeRoot, Path, Path], rel: str) -> None:
    """Writing below a symlinked directory is refused; nothing outside changes."""
    root, _, outside = tree
    before = sorted(p.name for p in outside.iterdir())
    with pytest.raises(SandboxError) as info:
        root.write_atomic(wp(rel), b"PWNED")
    assert info.value.code == ErrorCode.PERMISSION_DENIED
    assert (outside / "decoy.txt").read_text() == "DECOY\n"
    assert sorted(p.name for p in outside.iterdir()) == before
    assert not Path("/tmp/planted.txt").exists()


def test_write_to_a_link_replaces_the_link_not_the_target(
    tree: tuple[SafeRoot, Path, Path],
) -> None:
    """Writing at a link's own name replaces the link with a file; the target is untouched."""
    root, ws, outside = tree
    root.write_atomic(wp("file-link"), b"new content")
    assert (outside / "decoy.txt").read_text() == "DECOY\n"
    assert not (ws / "file-link").is_symlink()
    assert (ws / "file-link").read_bytes() == b"new content"


def test_unlink_removes_link_only(tree: tuple[SafeRoot, Path, Path]) -> None:
    """Deleting a link deletes the link, never its target."""
    root, ws, outside = tree
    root.unlink(wp("file-link"))
    assert not (ws / "file-link").exists() and (outside / "decoy.txt").exists()


def test_fifo_and_devices_refused(tree: tuple[SafeRoot, Path, Path]) -> None:
    """A fifo is not read (it would block): refused as not a regular file."""
    root, ws, _ = tree
    os.mkfifo(ws / "pipe")
    with pytest.raises(SandboxError, match="not a regular file") as info:
        root.read_bytes(wp("pipe"), 1 << 20)
    assert info.value.code == ErrorCode.PERMISSION_DENIED


def test_unix_socket_refused_as_not_a_regular_file(tree: tuple[SafeRoot, Path, Path]) -> None:
    """A Unix socket (open(2) says ENXIO) is PERMISSION_DENIED 'not a regular file', never INTERNAL."""
    root, ws, _ = tree
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(ws / "s.sock"))
    try:
        with pytest.raises(SandboxError, match="not a regular file") as info:
            root.read_bytes(wp("s.sock"), 1 << 20)
    finally:
        server.close()
    assert info.value.code == ErrorCode.PERMISSION_DENIED


def test_list_files_skips_links_and_directories(tree: tuple[SafeRoot, Path, Path]) -> None:
    """list_files names regular files only; a link to a directory outside is not entered or listed."""
    root, _, _ = tree
    assert [name for name, _ in root.list_files(WorkspacePath(()))] == ["ok.txt"]
    with pytest.raises(SandboxError) as info:
        root.list_files(wp("dir-link"))
    assert info.value.code == ErrorCode.PERMISSION_DENIED


def test_size_cap(tree: tuple[SafeRoot, Path, Path]) -> None:
    """Files over the cap are refused with their size."""
    root, ws, _ = tree
    (ws / "big").write_bytes(b"x" * 2048)
    with pytest.raises(SandboxError) as info:
        root.read_bytes(wp("big"), 1024)
    assert info.value.details["size"] == 2048 and "2048 bytes" in info.value.message


def test_atomic_write_creates_parents_and_leaves_no_temp(tree: tuple[SafeRoot, Path, Path]) -> None:
    """Parents are created; no temp file is left behind; mode of an existing file is kept."""
    root, ws, _ = tree
    root.write_atomic(wp("a/b/c.txt"), b"1")
    assert (ws / "a/b/c.txt").read_bytes() == b"1"
    os.chmod(ws / "a/b/c.txt", 0o600)
    root.write_atomic(wp("a/b/c.txt"), b"2")
    assert (ws / "a/b/c.txt").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (ws / "a/b").iterdir()] == ["c.txt"]


@pytest.mark.parametrize("changes", [1, 10])
def test_a_file_that_changes_while_it_is_read_is_read_again_or_refused(
    tree: tuple[SafeRoot, Path, Path], monkeypatch: pytest.MonkeyPatch, changes: int
) -> None:
    """The read took one byte more than the size and never looked at it: a file growing under
    it gave max_bytes + 1 bytes, the new data with the old time. Now a read whose size or times
    moved is read again; a file that keeps growing (a log being written) comes back as it was at
    the last size check. The bytes returned always match the size returned."""
    from sandbox.fs import safe

    root, ws, _ = tree
    target = ws / "log.txt"
    real = safe._pread_all
    left = [0]

    def growing(fd: int, limit: int) -> bytes:
        if left[0] > 0:  # a writer appends between the size check and the read
            left[0] -= 1
            with open(target, "ab") as out:
                out.write(b"b" * 100)
        return real(fd, limit)

    monkeypatch.setattr(safe, "_pread_all", growing)
    left[0] = changes
    target.write_bytes(b"a" * 900)
    data, st = root.read_bytes(wp("log.txt"), 1 << 20)
    assert len(data) == st.size
    if changes < safe.READ_TRIES:  # read again until it held still: the whole file
        assert data == target.read_bytes()
    else:  # still growing at the last try: the file as it was at that try's size check
        assert data == b"a" * 900 + b"b" * 100 * (safe.READ_TRIES - 1) and target.stat().st_size > st.size


def test_a_file_rewritten_in_place_on_every_try_is_a_conflict(
    tree: tuple[SafeRoot, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file rewritten under every try (not only grown) has no version to give: CONFLICT, with
    what to do about it."""
    from sandbox.fs import safe

    root, ws, _ = tree
    target = ws / "f.txt"
    target.write_bytes(b"x" * 100)
    real = safe._pread_all
    turn = [0]

    def rewritten(fd: int, limit: int) -> bytes:
        data = real(fd, limit)
        turn[0] += 1
        target.write_bytes(bytes([65 + turn[0]]) * 50)  # shorter each time, other bytes
        return data

    monkeypatch.setattr(safe, "_pread_all", rewritten)
    with pytest.raises(SandboxError) as info:
        root.read_bytes(wp("f.txt"), 1 << 20)
    assert info.value.code == ErrorCode.CONFLICT and "changed while it was read" in info.value.message


def test_a_same_size_rewrite_with_its_time_set_back_is_still_seen(
    tree: tuple[SafeRoot, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox can rewrite a file at the same size mid-read and set its mtime back (utimensat),
    not its ctime: the read is done again, and what comes back is one version, whole."""
    from sandbox.fs import safe

    root, ws, _ = tree
    target = ws / "f.txt"
    target.write_bytes(b"old-old!")
    real = safe._pread_all
    once = [True]

    def rewritten(fd: int, limit: int) -> bytes:
        data = real(fd, limit)
        if once[0]:
            once[0] = False
            st = target.stat()
            target.write_bytes(b"NEW-NEW!")
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        return data

    monkeypatch.setattr(safe, "_pread_all", rewritten)
    data, _ = root.read_bytes(wp("f.txt"), 1 << 20)
    assert data == b"NEW-NEW!"


@pytest.mark.anyio
async def test_file_states_are_written_only_when_they_change(tmp_path: Path) -> None:
    """Reading a file again unchanged writes nothing; a new version, of this file or another, is
    one line appended; a fresh reader sees what was recorded."""
    from sandbox.fs.states import FileStates, digest

    path = tmp_path / "file-states.json"
    states = FileStates(path)
    await states.record("/ws/a.txt", b"one", 1)
    size = path.stat().st_size
    await states.record("/ws/a.txt", b"one", 1)
    assert path.stat().st_size == size
    await states.record("/ws/a.txt", b"two", 2)
    assert path.stat().st_size > size and len(path.read_text().splitlines()) == 2
    await states.record("/ws/b.txt", b"two", 2)
    again = FileStates(path)
    seen = await again.get("/ws/a.txt")
    assert seen is not None and seen.sha256 == digest(b"two")
    assert await again.get("/ws/b.txt") is not None


@pytest.mark.anyio
async def test_file_states_cost_one_line_per_new_file_however_many_were_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session that has seen many files (a tenant reading a huge tree) records the next one by
    appending one line, not by rewriting the map on the event loop; the newest MAX_SEEN are
    kept, and the log is compacted to them once it holds twice as many lines."""
    from sandbox.fs import states as states_module
    from sandbox.fs.states import FileStates

    monkeypatch.setattr(states_module, "MAX_SEEN", 10)
    path = tmp_path / "file-states.json"
    states = FileStates(path)
    for i in range(15):
        await states.record(f"/ws/f{i}", b"x", i)
    before, inode, head = path.stat().st_size, path.stat().st_ino, path.read_bytes()
    await states.record("/ws/new", b"y", 99)
    after = path.read_bytes()
    assert after.startswith(head) and path.stat().st_ino == inode  # nothing rewritten
    line = after[before:]
    assert line.count(b"\n") == 1 and b"/ws/new" in line  # one line appended
    for i in range(16, 30):
        await states.record(f"/ws/f{i}", b"x", i)
    assert len(path.read_text().splitlines()) <= 2 * 10 + 1  # compacted
    fresh = FileStates(path)
    assert await fresh.get("/ws/f29") is not None and await fresh.get("/ws/f20") is not None
    assert await fresh.get("/ws/f0") is None  # the oldest went: as if never read


@pytest.mark.anyio
async def test_file_states_read_a_line_only_once_it_is_whole_and_take_the_old_format(tmp_path: Path) -> None:
    """A line another holder is still appending is not read half; a damaged line is skipped; a
    file written in the old format (one JSON object) is read and rewritten as a log."""
    import json

    from sandbox.fs.states import FileStates, digest

    path = tmp_path / "file-states.json"
    path.write_text(json.dumps({"/ws/old": {"sha256": digest(b"old"), "mtime_ns": 5}}))
    states = FileStates(path)
    seen = await states.get("/ws/old")
    assert seen is not None and seen.sha256 == digest(b"old")
    assert json.loads(path.read_text().splitlines()[0])["k"] == "/ws/old"  # now a log
    with path.open("a") as log:
        log.write("not json\n")
        log.write('{"k": "/ws/torn", "h": "ab')  # half a line
    assert await states.get("/ws/torn") is None
    with path.open("a") as log:
        log.write('cd", "t": 7}\n')
    torn = await states.get("/ws/torn")
    assert torn is not None and torn.sha256 == "abcd" and torn.mtime_ns == 7
    assert await states.get("/ws/old") is not None


def test_a_file_under_another_process_s_lease_is_a_conflict_not_an_internal_error(
    tree: tuple[SafeRoot, Path, Path],
) -> None:
    """A sandbox can take a write lease on its own file (no capability needed): the read's
    non-blocking open fails at once, and the model is told to try again (CONFLICT), not that the
    orchestrator broke (INTERNAL)."""
    import subprocess
    import sys

    root, ws, _ = tree
    (ws / "leased.txt").write_text("x")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, signal, sys, time\n"
            "signal.signal(signal.SIGIO, signal.SIG_IGN)\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)\n"
            "print('held', flush=True)\n"
            "time.sleep(30)\n",
            str(ws / "leased.txt"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(SandboxError) as info:
            root.read_bytes(wp("leased.txt"), 1 << 20)
        assert info.value.code == ErrorCode.CONFLICT and "lease" in info.value.message
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
