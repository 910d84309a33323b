-- The journal's events of every replica (state/shipping.py ships each replica's journal here in
-- batches, after the fact): what GET /v1/logs answers on any replica. `origin` is the journal a
-- row came from and `origin_id` its row there, so a batch shipped twice lands once. `bytes` is
-- what a row weighs for journal.retention's size bound (its text and a fixed overhead).
CREATE TABLE IF NOT EXISTS sbx_events (
    id BIGSERIAL PRIMARY KEY,
    origin TEXT NOT NULL,
    origin_id BIGINT NOT NULL,
    ts DOUBLE PRECISION NOT NULL,
    trace_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    session TEXT NOT NULL,
    tenant TEXT NOT NULL,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    stage TEXT NOT NULL,
    duration_ms DOUBLE PRECISION,
    data TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    UNIQUE (origin, origin_id)
);
-- a tenant's page, of one session or of one trace, walks only its rows, newest first
CREATE INDEX IF NOT EXISTS sbx_events_tenant ON sbx_events (tenant, id);
CREATE INDEX IF NOT EXISTS sbx_events_tenant_session ON sbx_events (tenant, session, id);
CREATE INDEX IF NOT EXISTS sbx_events_tenant_trace ON sbx_events (tenant, trace_id, id);
CREATE INDEX IF NOT EXISTS sbx_events_ts ON sbx_events (ts);
-- how far each journal was shipped (kept when retention removes all of its rows: a restarted
-- replica never ships again what was pruned)
CREATE TABLE IF NOT EXISTS sbx_event_origins (
    origin TEXT PRIMARY KEY,
    shipped_up_to BIGINT NOT NULL
);
-- the table's live rows and bytes, kept exact by every insert and delete (retention's size bound)
CREATE TABLE IF NOT EXISTS sbx_events_size (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    rows BIGINT NOT NULL,
    bytes BIGINT NOT NULL
);
INSERT INTO sbx_events_size (one, rows, bytes) VALUES (TRUE, 0, 0) ON CONFLICT DO NOTHING;
