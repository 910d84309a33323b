"""The real service keeps its journal bounded: journal.retention is enforced while it runs."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox.config import load_config_text
from sandbox.journal.store import Journal
from tests.service_helpers import TOKEN_A, serve, sha

DAY = 86400.0


def retained_for_a_day(state: Path, workspace: Path) -> Any:
    """A one-tenant service whose journal.retention keeps a day, applied every 0.2 s."""
    return load_config_text(f"""
state_dir: {state}
tenants: [{{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list: [{{id: alpha, tenant: acme, workspace: "{workspace}"}}]
journal: {{retention: {{max_age: 1d, max_bytes: 0, check_every_s: 0.2}}}}
""")


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_the_service_prunes_events_past_max_age_and_keeps_open_calls(tmp_path: Path) -> None:
    """Events two days old go within seconds of start under max_age 1d; today's, and an open call's old ones, stay."""
    state = tmp_path / "state"
    journal = Journal(state / "journal.sqlite3")
    for i in range(5):
        journal.append(
            trace_id="t", call_id=f"today-{i}", session="agent:alpha:s", tenant="acme", agent="alpha",
            tool="exec", stage="finished",
        )  # fmt: skip
    journal.append(
        trace_id="t",
        call_id="running",
        session="agent:alpha:s",
        tenant="acme",
        agent="alpha",
        tool="exec",
        stage="running",
    )  # fmt: skip  (open, owned by this live process)
    journal.close()
    db = sqlite3.connect(state / "journal.sqlite3")
    old = time.time() - 2 * DAY
    db.executemany(
        "INSERT INTO events(ts, trace_id, call_id, session, tenant, agent, tool, stage, data) "
        "VALUES (?, 't', ?, 'agent:alpha:s', 'acme', 'alpha', 'exec', 'finished', '{}')",
        [(old, f"old-{i}") for i in range(200)],
    )
    db.execute("UPDATE events SET ts = ? WHERE call_id = 'running'", (old,))
    db.commit()
    db.close()
    cfg = retained_for_a_day(state, tmp_path / "wa")
    reader = Journal(state / "journal.sqlite3")
    with serve(cfg):
        deadline = time.monotonic() + 60
        while any(e.call_id.startswith("old-") for e in reader.page(tenant="acme", limit=1000).events):
            assert time.monotonic() < deadline, "the service never pruned the journal"
            time.sleep(0.1)
    left = {e.call_id for e in reader.page(tenant="acme", limit=1000).events}
    reader.close()
    assert left == {f"today-{i}" for i in range(5)} | {"running"}


@pytest.mark.slow
def test_the_service_prunes_the_sessions_registry_past_max_age(tmp_path: Path) -> None:
    """The same retention reaches the sessions registry: a message two days old goes, today's stays."""
    from sandbox.sessions.child import REGISTRY_FILE
    from sandbox.sessions.registry import Registry

    state = tmp_path / "state"
    state.mkdir()
    registry = Registry(state / REGISTRY_FILE)
    registry.send("acme", "agent:alpha:child", "agent:alpha:s", "old")
    registry.send("acme", "agent:alpha:child", "agent:alpha:s", "today")
    registry.close()
    db = sqlite3.connect(state / REGISTRY_FILE)
    db.execute("UPDATE inbox SET created_at = created_at - ? WHERE text = 'old'", (2 * DAY,))
    db.commit()
    db.close()
    cfg = retained_for_a_day(state, tmp_path / "wa")

    def texts() -> list[str]:
        reader = Registry(state / REGISTRY_FILE)
        try:
            return [m.text for m in reader.messages("acme", "agent:alpha:child")]
        finally:
            reader.close()

    with serve(cfg):
        deadline = time.monotonic() + 60
        while "old" in texts():
            assert time.monotonic() < deadline, "the service never pruned the sessions registry"
            time.sleep(0.1)
    assert texts() == ["today"]
