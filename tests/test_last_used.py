"""Last-use times are written off the event loop (runtime/last_used.py): a touch is in what is
read at once, on disk soon after, and merged with what another process wrote."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sandbox.runtime.last_used import LastUsed


def test_a_touch_is_read_at_once_and_written_merged_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / "last-used.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"other": "2026-01-01T00:00:00+00:00"}))  # another process's
    record = LastUsed(path)
    record.touch("sbx-a")
    assert set(record.read()) == {"other", "sbx-a"}
    deadline = time.monotonic() + 10
    while "sbx-a" not in json.loads(path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    on_disk = json.loads(path.read_text())
    assert set(on_disk) == {"other", "sbx-a"} and on_disk["other"] == "2026-01-01T00:00:00+00:00"
    record.touch("sbx-b")
    record.flush()
    assert set(json.loads(path.read_text())) == {"other", "sbx-a", "sbx-b"}
    assert not list(path.parent.glob(".*.tmp"))


def test_an_unwritable_state_dir_costs_only_the_record(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    record = LastUsed(blocker / "last-used.json")  # its folder is a file: every write fails
    record.touch("sbx-a")
    record.flush()
    assert record.read() == {}  # lost, and said in the log; nothing raised into the call


def test_a_flush_beside_the_writer_loses_no_name(tmp_path: Path) -> None:
    """flush() waits for the writer's own thread: a write on the caller's thread beside it lost
    the newer names (7 times in 500 before)."""
    for i in range(200):
        path = tmp_path / f"last-used-{i}.json"
        record = LastUsed(path)
        record.touch("a")
        record.flush()
        record.touch("b")
        record.flush()
        assert set(json.loads(path.read_text())) == {"a", "b"}, i


def test_a_removed_sandbox_s_time_goes_from_the_file(tmp_path: Path) -> None:
    """A month of sessions must not leave a line each in a file every write rewrites whole."""
    path = tmp_path / "last-used.json"
    path.write_text(json.dumps({"other": "2026-01-01T00:00:00+00:00"}))  # another process's
    record = LastUsed(path)
    for i in range(50):
        record.touch(f"sbx-{i}")
        record.forget(f"sbx-{i}")
    record.touch("sbx-kept")
    record.forget("never-touched")
    assert set(record.read()) == {"other", "sbx-kept"}  # at once, before it is written
    record.flush()
    assert set(json.loads(path.read_text())) == {"other", "sbx-kept"}
    record.forget("other")  # removed by this process, touched by another: gone from the file too
    record.touch("sbx-0")  # a new sandbox under a removed one's name counts again
    record.flush()
    assert set(json.loads(path.read_text())) == {"sbx-kept", "sbx-0"}


def test_a_removal_never_drops_a_later_use_another_process_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI prune removes a sandbox while the service makes a new one of that name (the warm
    pool hands one over at once): the prune's forget, written after the service's use, must not
    wipe it, or the next prune would judge the new sandbox idle since its creation."""
    from datetime import UTC, datetime, timedelta

    from sandbox.runtime import last_used

    path = tmp_path / "last-used.json"
    pruner = LastUsed(path)
    monkeypatch.setattr(last_used._WRITER, "submit", lambda fn: None)  # held: written when flushed
    pruner.forget("sbx-x")
    pruner.forget("sbx-old")
    later = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    path.write_text(json.dumps({"sbx-x": later, "sbx-old": "2026-01-01T00:00:00+00:00"}))  # the service's
    monkeypatch.undo()
    pruner.flush()
    assert json.loads(path.read_text()) == {"sbx-x": later}
