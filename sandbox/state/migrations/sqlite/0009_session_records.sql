-- Session records (kept in step with postgresql/0009_session_records.sql). The embedded default
-- keeps them in each session's state dir (tools/process_table.py); this table is here so both
-- dialects have the same steps.
CREATE TABLE IF NOT EXISTS sbx_session_records (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (tenant, session, kind, key)
);
