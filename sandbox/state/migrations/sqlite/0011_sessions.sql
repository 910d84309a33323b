-- The sessions registry (kept in step with postgresql/0011_sessions.sql). The embedded default
-- keeps it in the state dir's own registry database (sessions/registry.py); these tables are
-- here so both dialects have the same steps.
CREATE TABLE IF NOT EXISTS sbx_lineage (
    key TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    agent TEXT NOT NULL,
    parent TEXT NOT NULL,
    depth INTEGER NOT NULL,
    name TEXT NOT NULL,
    task TEXT NOT NULL,
    tools TEXT,
    parent_view TEXT NOT NULL,
    parent_source TEXT NOT NULL,
    created_by_call TEXT NOT NULL,
    created_at REAL NOT NULL,
    status TEXT NOT NULL,
    closed_at REAL
);
CREATE TABLE IF NOT EXISTS sbx_inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    sender TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sbx_cascades (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    agent TEXT NOT NULL,
    started_at REAL NOT NULL,
    PRIMARY KEY (tenant, key)
);
