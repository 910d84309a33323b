"""Finding a uid's processes through /proc (runtime/proc_kill.py): what a closed session's
processes are found by, from the host, before they are killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from sandbox.runtime.proc_kill import Members, host_uid, mapped_uid, members_of, owned_by, runs_as, signal_members


def as_nobody(work: Callable[[], bytes]) -> bytes:
    """What `work` returns when run in a forked child that dropped to uid and gid 65534 (the
    modules are loaded already: nobody cannot read this interpreter's files)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another uid")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write_end, work())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    return said


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_uid_s_processes_are_found_and_the_caller_is_never_one(child: subprocess.Popen[bytes]) -> None:
    me = os.getuid()
    found = owned_by([os.getpid(), child.pid], me)
    assert found.pids == (child.pid,) and found.visible
    assert owned_by([child.pid], me + 1).pids == ()


def test_a_gone_process_is_skipped(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    child.wait()
    assert owned_by([child.pid], os.getuid()).pids == ()
    assert host_uid(child.pid, 1000) is None


def test_the_host_number_of_a_uid_follows_the_process_s_map() -> None:
    with open("/proc/self/uid_map") as f:
        inside, outside, count = (int(n) for n in f.read().split()[:3])
    assert host_uid(os.getpid(), inside) == outside
    assert host_uid(os.getpid(), inside + 1000) == (outside + 1000 if count > 1000 else None)


@pytest.mark.parametrize(
    ("uid_map", "uid", "host"),
    [
        ("         0          0 4294967295\n", 20001, 20001),  # no user namespace
        ("         0     100000      65536\n", 20001, 120001),  # userns-remap: the container's 20001
        ("         0     100000      65536\n", 65536, None),  # past the map: nobody on the host
        ("0 1000 1\n1 100000 65535\n", 0, 1000),  # rootless: root is the user who ran the engine
        ("0 1000 1\n1 100000 65535\n", 20001, 120000),
    ],
)
def test_uids_are_translated_through_the_map(uid_map: str, uid: int, host: int | None) -> None:
    assert mapped_uid(uid_map, uid) == host


def test_a_zombie_is_not_running_as_anyone() -> None:
    assert runs_as("Name:\tsleep\nState:\tS (sleeping)\nUid:\t20001\t20001\t20001\t20001\n", 20001)
    assert not runs_as("Name:\tsleep\nState:\tZ (zombie)\nUid:\t20001\t20001\t20001\t20001\n", 20001)
    assert not runs_as("Name:\tsleep\nState:\tS (sleeping)\nUid:\t20002\t20002\t20002\t20002\n", 20001)
    # a leader that exited while its other threads run shows Z, and is alive (it must be killed)
    assert runs_as("Name:\tx\nState:\tZ (zombie)\nUid:\t20001\t20001\t20001\t20001\nThreads:\t2\n", 20001)
    # real, effective or saved: a process that swapped one of them is still the user's
    assert runs_as("State:\tR (running)\nUid:\t1000\t20001\t1000\t20001\n", 20001)


def test_a_signal_the_kernel_refuses_is_reported_not_swallowed() -> None:
    """A non-root orchestrator cannot signal a session's processes from the host: the caller
    must hear it (and kill from inside), not count the round as done."""
    root_pid = os.getpid()  # this test's process: not nobody's to signal
    said = as_nobody(lambda: b"True" if signal_members(Members((root_pid,)), "TERM") else b"False")
    assert said == b"False"


LEADER_EXITS = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(30,)).start()
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the process runs on in the other
"""


def test_a_process_whose_leader_thread_exited_is_still_found_and_killed() -> None:
    """Its /proc entry says Z (zombie) and its environment cannot be read, yet it runs: both the
    uid's search and a call's tag search must find it, or it would outlive a kill."""
    proc = subprocess.Popen([sys.executable, "-c", LEADER_EXITS], env={**os.environ, "SBX_CALL": "c_leader"})
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/status") as f:
                status = f.read()
            if "State:\tZ" in status:
                break
            time.sleep(0.02)
        assert "State:\tZ" in status and "Threads:\t2" in status, status
        assert owned_by([proc.pid], os.getuid()).pids == (proc.pid,)
        assert members_of([proc.pid], "c_leader").pids == (proc.pid,)
        assert signal_members(Members((proc.pid,)), "KILL")
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()
        proc.wait()


def test_as_its_own_non_root_user_such_a_process_is_found_too() -> None:
    """The host runtime's orchestrator may be an ordinary user: the exited leader refuses even
    its own user its environment (EACCES), and its live thread answers instead."""

    def find_own() -> bytes:
        proc = subprocess.Popen(
            ["/usr/bin/python3", "-I", "-S", "-c", LEADER_EXITS], env={"SBX_CALL": "c_nobody"}, cwd="/"
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/status") as f:
                if "State:\tZ" in f.read():
                    break
            time.sleep(0.02)
        found = members_of([proc.pid], "c_nobody", skip_unreadable=True).pids == (proc.pid,)
        proc.kill()
        proc.wait()
        return b"found" if found else b"missed"

    assert as_nobody(find_own) == b"found"
