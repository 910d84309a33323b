-- Call records (kept in step with postgresql/0003_calls.sql). The embedded default keeps them
-- in the journal (journal/calls.py), which every process of one state_dir shares; this table is
-- here so both dialects have the same steps.
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
CREATE UNIQUE INDEX IF NOT EXISTS calls_key ON calls (tenant, idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS calls_created ON calls (created);
