"""Collecting the egress proxy's lines into the journal: hostile lines are dropped, each line is
journaled once, and lines lost to a rotated log are on record as lost. The proxy's log is faked
(the fault: a log that rotated, lines nobody would write); the journal is real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker.errors

from sandbox.journal.store import Journal
from sandbox.runtime.docker import egress, egress_log
from sandbox.runtime.naming import Labels


class FakeEngine:
    """Just what the collector asks the engine: the proxy's labels and its log."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        self.api = self

    def inspect_container(self, name: str) -> dict[str, Any]:
        if name != egress.names("sbx-box").proxy:
            raise docker.errors.NotFound("no such container")
        labels = {Labels.TENANT: "acme", Labels.AGENT: "builder", Labels.SESSION: "agent:builder:s1"}
        return {"Id": "f" * 64, "Config": {"Labels": labels}}

    def logs(self, container: str, **_: Any) -> bytes:
        return b"\n".join(self.lines)


def _line(seq: int, **extra: Any) -> bytes:
    return json.dumps({"egress": seq, "ts": 1.0 + seq, "host": "pypi.org", "verdict": "allowed", **extra}).encode()


def test_lines_are_journaled_once_and_gaps_are_on_record(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    try:
        engine = FakeEngine([b'{"egress": 0, "ready": true}', _line(1), _line(2), _line(5)])
        assert egress_log.collect_sync(journal, engine, "sbx-box") == 3
        assert egress_log.collect_sync(journal, engine, "sbx-box") == 0  # nothing new: nothing twice
        events = [e for e in journal.events(session="agent:builder:s1") if e.stage == "egress"]
        assert [e.data["seq"] for e in events] == [1, 2, 3, 5]
        lost = events[2].data
        assert lost["verdict"] == "lost" and "3..4" in lost["reason"]
        assert {(e.tenant, e.agent) for e in events} == {("acme", "builder")}
    finally:
        journal.close()


def test_hostile_lines_are_dropped(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    try:
        engine = FakeEngine(
            [
                b'{"egress": 1, "host": "' + b"a" * 5000 + b'"}',  # longer than any line the addon writes
                b"not json at all",
                b'{"egress": "2", "host": "x"}',  # a number that is not one
                b'{"egress": 3, "host": {"nested": 1}, "verdict": "allowed", "unknown": "field"}',
                b'["egress", 4]',
            ]
        )
        egress_log.collect_sync(journal, engine, "sbx-box")
        events = [e for e in journal.events(session="agent:builder:s1") if e.stage == "egress"]
        kept = [e.data for e in events if e.data.get("verdict") != "lost"]
        assert kept == [{"verdict": "allowed", "seq": 3}]  # only plain known fields survive
        assert egress_log.collect_sync(journal, engine, "sbx-gone") == 0  # no proxy: nothing, no error
    finally:
        journal.close()
