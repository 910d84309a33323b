-- Events (kept in step with postgresql/0005_events.sql). The embedded default's events are the
-- journal's own (journal/store.py), which every process of one state_dir shares; these tables
-- are here so both dialects have the same steps.
CREATE TABLE IF NOT EXISTS sbx_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    origin TEXT NOT NULL,
    origin_id INTEGER NOT NULL,
    ts REAL NOT NULL,
    trace_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    session TEXT NOT NULL,
    tenant TEXT NOT NULL,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    stage TEXT NOT NULL,
    duration_ms REAL,
    data TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    UNIQUE (origin, origin_id)
);
CREATE TABLE IF NOT EXISTS sbx_event_origins (
    origin TEXT PRIMARY KEY,
    shipped_up_to INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sbx_events_size (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    rows INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO sbx_events_size (one, rows, bytes) VALUES (1, 0, 0);
