"""The journal's tables, its schema version, and the statements the writer thread runs.

The schema only ever grows by `CREATE ... IF NOT EXISTS`, so opening a journal written by an
older version brings it up to date in place; `PRAGMA user_version` records which version last
did, so a journal written by a newer version is refused rather than misread.
"""

from __future__ import annotations

import sqlite3

from sandbox.errors import ErrorCode, SandboxError

# 1: tables of before (no version recorded); 2: the tenant and time indexes that keep a page
# of `logs` and a retention batch O(limit) however large the journal grows
SCHEMA_VERSION = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    trace_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    session TEXT NOT NULL,
    tenant TEXT NOT NULL,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    stage TEXT NOT NULL,
    duration_ms REAL,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_call ON events(call_id);
CREATE INDEX IF NOT EXISTS events_trace ON events(trace_id);
CREATE INDEX IF NOT EXISTS events_session ON events(session);
CREATE INDEX IF NOT EXISTS events_tenant ON events(tenant);
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY,
    call_id TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    session TEXT NOT NULL,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    decided REAL
);
CREATE TABLE IF NOT EXISTS loop_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    result TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS loop_calls_session ON loop_calls(tenant, session, id);
CREATE TABLE IF NOT EXISTS loop_sessions (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    tripped INTEGER NOT NULL DEFAULT 0,
    since_id INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, session)
);
CREATE TABLE IF NOT EXISTS open_calls (
    call_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    stage TEXT NOT NULL,
    ts REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS owners (
    owner TEXT PRIMARY KEY,
    lease_until REAL NOT NULL
);
"""
# a call leaves open_calls with its last stage; these end what recovery has to look at
# (a re-attached background process stays open: later recoveries report when it exits)
SETTLED = frozenset({"process_exited", "process_gone"})
TERMINAL = frozenset({"finished", "failed", "blocked", "denied", "invalid", "not_found", "abandoned"})
UPSERT_OPEN = (
    "INSERT INTO open_calls(call_id, owner, stage, ts) VALUES (?,?,?,?) "
    "ON CONFLICT(call_id) DO UPDATE SET owner = excluded.owner, stage = excluded.stage, ts = excluded.ts"
)
DELETE_OPEN = "DELETE FROM open_calls WHERE call_id = ?"
UPSERT_LEASE = (
    "INSERT INTO owners(owner, lease_until) VALUES (?,?) "
    "ON CONFLICT(owner) DO UPDATE SET lease_until = excluded.lease_until"
)
# journals written before open_calls existed: their unfinished calls, owner unknown (= gone)
BACKFILL_OPEN = (
    "INSERT OR IGNORE INTO open_calls(call_id, owner, stage, ts) "
    "SELECT call_id, '', stage, ts FROM events WHERE id IN (SELECT MAX(id) FROM events GROUP BY call_id) "
    "AND stage NOT IN ({})"
)
INSERT_EVENT = (
    "INSERT INTO events(ts, trace_id, call_id, session, tenant, agent, tool, stage, duration_ms, data) "
    "VALUES (?,?,?,?,?,?,?,?,?,?)"
)
INSERT_LOOP_CALL = "INSERT INTO loop_calls(tenant, session, tool, args, result) VALUES (?,?,?,?,?)"


def migrate(db: sqlite3.Connection, where: str) -> None:
    """Bring the journal's tables and indexes up to :data:`SCHEMA_VERSION` (idempotent).

    A journal from before the index of version 2 gets it here, once: at a million events
    that takes a few seconds, during which other processes opening it wait (busy timeout).

    Raises:
        SandboxError: INTERNAL for a journal written by a newer version of this program.
        sqlite3.Error: the file is not a database, or cannot be written.
    """
    found = int(db.execute("PRAGMA user_version").fetchone()[0])
    if found > SCHEMA_VERSION:
        raise SandboxError(
            ErrorCode.INTERNAL,
            f"the journal at {where} has schema version {found}, newer than this program's "
            f"({SCHEMA_VERSION}); upgrade agent-sandbox or point state_dir elsewhere",
        )
    had_open = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'open_calls'").fetchone()
    db.executescript(SCHEMA)
    if not had_open:
        closed = ",".join("?" * len(TERMINAL | SETTLED))
        db.execute(BACKFILL_OPEN.format(closed), tuple(sorted(TERMINAL | SETTLED)))
    if found < SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
