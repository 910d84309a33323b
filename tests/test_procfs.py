"""Reading a container's procfs options and deciding what can be applied (runtime/docker/procfs.py)."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest

from sandbox.runtime.docker import procfs
from sandbox.runtime.docker.procfs import apply, hide_in, is_hidden, options_of_proc

RUNC = """\
100 99 0:52 / / ro,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u
107 106 0:52 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw,hidepid=invisible
108 107 0:53 / /proc/kcore rw,nosuid - tmpfs tmpfs ro,size=0k
109 100 0:54 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
"""
GVISOR_SENTRY = "12 11 0:21 / / rw - tmpfs none rw\n"


def test_the_proc_mount_is_found_among_the_masks() -> None:
    """The options are the /proc mount's superblock's, not a masked path's beneath it."""
    assert options_of_proc(RUNC) == "rw,hidepid=invisible"
    assert is_hidden("rw,hidepid=invisible") and is_hidden("rw,hidepid=2")
    assert not is_hidden("rw") and not is_hidden("rw,hidepid=ptraceable") and not is_hidden("rw,hidepid=1")


def test_the_top_mount_wins_and_a_table_without_proc_has_none() -> None:
    """Of two procfs stacked on /proc the last listed is the one seen; none at all is None."""
    stacked = RUNC + "200 107 0:60 / /proc rw - proc proc rw\n"
    assert options_of_proc(stacked) == "rw"
    assert options_of_proc(GVISOR_SENTRY) is None
    assert options_of_proc("garbage\n\n1 2 3\n") is None


def _never(path: str) -> None:
    raise AssertionError(f"reconfigured {path}")


def test_a_process_outside_the_container_is_not_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pid that is not in the named container's cgroup (or pid 1, or none) is never reconfigured."""
    monkeypatch.setattr(procfs, "_reconfigure", _never)
    mine = apply(os.getpid(), "f" * 64)
    assert not mine.applied and "cannot see" in mine.reason
    assert "cannot see" in apply(0, "f" * 64).reason
    assert not apply(1, "f" * 64).applied


def test_nothing_is_done_where_no_sessions_share_the_container() -> None:
    """Without session users there is no one to hide from: nothing is read or changed."""
    spec = SimpleNamespace(session_users=False, name="x")
    assert hide_in({"Id": "abc", "State": {"Pid": 123}}, spec) is None


def test_a_gap_is_logged_once_per_container(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where it cannot be applied the sandbox is still made, and the gap is logged (once)."""
    from sandbox.testing import capture_logs

    monkeypatch.setattr(procfs, "_warned", OrderedDict())
    spec = SimpleNamespace(session_users=True, name="sbx-x")
    with capture_logs() as logs:
        for _ in range(3):
            found = hide_in({"Id": "c" * 64, "State": {"Pid": 0}}, spec)
            assert found is not None and not found.applied
    gaps = [e for e in logs if e.get("event") == "sandbox_processes_visible"]
    assert len(gaps) == 1 and "cannot see" in str(gaps[0].get("reason")), logs


def test_doctor_names_agents_whose_runtime_cannot_hide(tmp_path: Path) -> None:
    """An agent sharing containers on runsc is a doctor warning; session-scoped ones are not counted."""
    from sandbox.config import load_config_text

    config = load_config_text(
        f"state_dir: {tmp_path}\nagents:\n  defaults: {{sandbox: {{mode: all, scope: agent}}}}\n"
        "  list: [{id: a}, {id: g, sandbox: {docker: {runtime: runsc}}}, "
        "{id: s, sandbox: {scope: session, docker: {runtime: kata}}}]\n"
    )
    assert procfs.shared_runtimes(config) == {"", "runsc"}
    status, name, detail, fix = procfs.probe(None, "unused", {"", "runsc"})
    assert (status, name) == ("warn", "process hiding") and "runsc" in detail and "scope: session" in fix


def test_a_pid_sharing_the_orchestrators_procfs_is_never_reconfigured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime whose State.Pid is a host process (a VM shim in the container's cgroup) would
    point at the host's own /proc: it is reported as a gap, and the host's procfs is untouched."""
    monkeypatch.setattr(procfs, "in_container", lambda pid, cid: True)
    monkeypatch.setattr(procfs, "_reconfigure", _never)
    found = apply(os.getpid(), "f" * 64)
    assert not found.applied and "orchestrator's own" in found.reason
