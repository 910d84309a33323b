-- Loop history (kept in step with postgresql/0010_loops.sql). The embedded default keeps it in
-- the journal (journal/loops.py); these tables are here so both dialects have the same steps.
CREATE TABLE IF NOT EXISTS sbx_loop_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    result TEXT NOT NULL,
    ts REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sbx_loop_sessions (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    tripped INTEGER NOT NULL DEFAULT 0,
    since_id INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, session)
);
