"""Finding a uid's processes through /proc (runtime/proc_kill.py): what a closed session's
processes are found by, from the host, before they are killed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sandbox.runtime.proc_kill import host_uid, mapped_uid, owned_by


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
