"""The journal's tables, its schema version, and the statements the writer thread runs.

The schema only ever grows by `CREATE ... IF NOT EXISTS`, so opening a journal written by an
older version brings it up to date in place; `PRAGMA user_version` records which version last
did, so a journal written by a newer version is refused rather than misread.
"""

from __future__ import annotations

import sqlite3
import time

from sandbox.errors import ErrorCode, SandboxError

# 1: tables of before (no version recorded); 2: the tenant and time indexes that keep a page
# of `logs` and a retention batch O(limit) however large the journal grows, loop rows' time
# (retention); journals made from then on use incremental auto-vacuum (set by the store when it
# creates the file: SQLite takes it only before the first page is written); 3: (tenant, session)
# and (tenant, trace_id), so a tenant's page of one session or trace walks only that tenant's
# rows of it, never a neighbour's same-named session (SQLite appends the row id to every index
# entry, so each is in id order within a tenant's session: `ORDER BY id DESC` needs no sort);
# 4: call records (call handles and idempotency keys, journal/calls.py); 5: the journal's own
# random id (`journal_meta`), which names it as the origin of the events it ships to a shared
# store (state/shipping.py): a journal moved aside and made anew is another origin; 6: a loop
# breaker's time (`loop_sessions.ts`, of its trip or reset), so retention bounds those rows too
SCHEMA_VERSION = 6

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
CREATE INDEX IF NOT EXISTS events_tenant_session ON events(tenant, session);
CREATE INDEX IF NOT EXISTS events_tenant_trace ON events(tenant, trace_id);
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
    result TEXT NOT NULL,
    ts REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS loop_calls_session ON loop_calls(tenant, session, id);
CREATE TABLE IF NOT EXISTS loop_sessions (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    tripped INTEGER NOT NULL DEFAULT 0,
    since_id INTEGER NOT NULL DEFAULT 0,
    ts REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, session)
);
CREATE INDEX IF NOT EXISTS loop_sessions_ts ON loop_sessions(ts);
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
CREATE TABLE IF NOT EXISTS calls (
    call_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    idem_key TEXT,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    result TEXT,
    reason TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    ended REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS calls_key ON calls(tenant, idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS calls_created ON calls(created);
CREATE TABLE IF NOT EXISTS journal_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT OR IGNORE INTO journal_meta(key, value) VALUES ('id', lower(hex(randomblob(16))));
"""
TABLES = frozenset(
    {"events", "approvals", "loop_calls", "loop_sessions", "open_calls", "owners", "calls", "journal_meta"}
)
# a call leaves open_calls with its last stage; these end what recovery has to look at
# (a re-attached background process stays open: later recoveries report when it exits)
# stages after which a call is no longer this journal's to settle (its open-call row goes)
SETTLED = frozenset({"process_exited", "process_gone", "adopted_elsewhere"})
# a durable call's stages (engine/handover.py): its command runs as a process of its own, which
# outlives its orchestrator; a gone owner's durable call waits for adoption, ADOPT_GRACE_S at most
DURABLE_STAGES = frozenset({"durable_started", "handed_over", "adopted"})
ADOPT_GRACE_S = 600.0
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
INSERT_LOOP_CALL = "INSERT INTO loop_calls(tenant, session, tool, args, result, ts) VALUES (?,?,?,?,?,?)"


def migrate(db: sqlite3.Connection, where: str) -> None:
    """Bring the journal's tables and indexes up to :data:`SCHEMA_VERSION` (idempotent).

    One write transaction, so two processes opening an old journal at once migrate it once.
    A journal from before version 2 (or 3) gets its new indexes here: at a million events that
    takes seconds, during which other processes opening it wait (their busy timeout).

    Raises:
        SandboxError: INTERNAL for a journal written by a newer version of this program.
        sqlite3.Error: the file is not a database, or cannot be written.
    """
    tables = _tables(db)
    if _version(db, where) == SCHEMA_VERSION and tables >= TABLES:
        return  # the common case: no write lock taken to open a journal
    db.execute("BEGIN IMMEDIATE")
    try:
        if _version(db, where) == SCHEMA_VERSION and _tables(db) >= TABLES:  # another process did it meanwhile
            db.execute("ROLLBACK")
            return
        _upgrade(db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _version(db: sqlite3.Connection, where: str) -> int:
    found = int(db.execute("PRAGMA user_version").fetchone()[0])
    if found > SCHEMA_VERSION:
        raise SandboxError(
            ErrorCode.INTERNAL,
            f"the journal at {where} has schema version {found}, newer than this program's "
            f"({SCHEMA_VERSION}); upgrade agent-sandbox or point state_dir elsewhere",
        )
    return found


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {str(r[1]) for r in db.execute(f"PRAGMA table_info({table})")}


def _tables(db: sqlite3.Connection) -> set[str]:
    return {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _upgrade(db: sqlite3.Connection) -> None:
    tables = _tables(db)
    if "loop_calls" in tables and "ts" not in _columns(db, "loop_calls"):
        db.execute("ALTER TABLE loop_calls ADD COLUMN ts REAL NOT NULL DEFAULT 0")  # 0: older than any bound
    if "loop_sessions" in tables and "ts" not in _columns(db, "loop_sessions"):
        # breakers from before have no time: they count from now, so none is dropped at once
        db.execute("ALTER TABLE loop_sessions ADD COLUMN ts REAL NOT NULL DEFAULT 0")
        db.execute("UPDATE loop_sessions SET ts = ?", (time.time(),))
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    if "open_calls" not in tables:
        closed = ",".join("?" * len(TERMINAL | SETTLED))
        db.execute(BACKFILL_OPEN.format(closed), tuple(sorted(TERMINAL | SETTLED)))
