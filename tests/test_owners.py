"""Call owners: whether the orchestrator that runs a call is alive, and the journal's open calls."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox.journal import owners
from sandbox.journal.owners import current_owner, owner_alive
from sandbox.journal.store import Journal


@pytest.mark.slow
def test_this_process_is_alive_and_a_finished_one_is_not() -> None:
    """The kernel answers for owners on this host: pid and start time must both match."""
    me = current_owner()
    host, _boot, pid, start = me.split("|")
    assert host.startswith(socket.gethostname() + "@") and int(pid) > 1 and start.isdigit()
    assert owner_alive(me, None, time.time())
    child = subprocess.run(
        [sys.executable, "-c", "from sandbox.journal.owners import current_owner; print(current_owner())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert not owner_alive(child.stdout.strip(), None, time.time())  # it has exited
    reused = "|".join([host, _boot, pid, str(int(start) + 1)])  # same pid, another process
    assert not owner_alive(reused, None, time.time())


def test_an_owner_in_another_pid_namespace_of_this_host_lives_by_its_lease() -> None:
    """A service in a container on the host's network (compose) has the host's name and boot but
    pids of its own: its pid 1 is not this host's pid 1, so the kernel here is not asked. Before,
    the host's own pid 1 (another start time) made it look dead, and a CLI beside it settled its
    live calls. An unknown start time is the lease's to judge too."""
    me = current_owner()
    host, boot, _pid, _start = me.split("|")
    name = host.rsplit("@", 1)[0]
    in_container = "|".join([f"{name}@4026532999", boot, "1", "12345"])
    now = time.time()
    assert not owners.owner_here(in_container)
    assert owner_alive(in_container, now + 10, now) and not owner_alive(in_container, now - 1, now)
    unknown_start = "|".join([host, boot, _pid, "?"])
    assert not owners.owner_here(unknown_start) and owner_alive(unknown_start, now + 10, now)
    assert owners.owner_here(me)


def test_other_hosts_live_by_their_lease() -> None:
    """An owner elsewhere is alive while its lease runs; an owner of an old journal is gone."""
    other = "elsewhere|boot|123|456"
    now = time.time()
    assert owner_alive(other, now + 10, now) and not owner_alive(other, now - 1, now)
    assert not owner_alive(other, None, now) and not owner_alive("", None, now)


def test_open_calls_track_unfinished_calls_with_their_owner(tmp_path: Path) -> None:
    """A call is open from its first stage to a terminal one, owned by the process that runs it."""
    journal = Journal(tmp_path / "journal.sqlite3")
    try:
        for call_id, stage in (("c1", "proposed"), ("c2", "proposed"), ("c2", "finished")):
            journal.append(
                call_id=call_id, stage=stage, trace_id="t", session="s", tenant="default", agent="a", tool="exec"
            )
        [(call_id, owner, stage, alive)] = journal.open_calls()
        assert (call_id, owner, stage, alive) == ("c1", current_owner(), "proposed", True)
    finally:
        journal.close()


def test_journals_from_before_owners_are_backfilled_as_ownerless(tmp_path: Path) -> None:
    """An older journal's unfinished calls become open calls with no owner: recovery may settle them."""
    path = tmp_path / "journal.sqlite3"
    Journal(path).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE open_calls")
        db.execute(
            "INSERT INTO events(ts, trace_id, call_id, session, tenant, agent, tool, stage, data) "
            "VALUES (1, 't', 'old', 's', 'default', 'a', 'exec', 'running', '{}')"
        )
    journal = Journal(path)
    try:
        assert journal.open_calls() == [("old", "", "running", False)]
    finally:
        journal.close()


def test_the_lease_is_renewed_while_a_call_is_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long call writes nothing for minutes; the heartbeat keeps its owner's lease current."""
    import sandbox.journal.store as store

    monkeypatch.setattr(owners, "LEASE_S", 0.3)
    monkeypatch.setattr(store, "LEASE_S", 0.3)
    journal = Journal(tmp_path / "journal.sqlite3")
    try:
        journal.append(
            call_id="long", stage="running", trace_id="t", session="s", tenant="default", agent="a", tool="x"
        )
        first = journal._read("SELECT lease_until FROM owners", ())[0][0]
        deadline = time.time() + 10
        while time.time() < deadline:
            time.sleep(0.05)
            if journal._read("SELECT lease_until FROM owners", ())[0][0] > first:
                break
        assert journal._read("SELECT lease_until FROM owners", ())[0][0] > first
    finally:
        journal.close()
