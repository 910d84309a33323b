-- Loop detection's history (engine/loops.py) shared by every replica: a model that repeats
-- itself through several replicas is counted once, and a tripped circuit breaker holds on all.
CREATE TABLE IF NOT EXISTS sbx_loop_calls (
    id BIGSERIAL PRIMARY KEY,
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    result TEXT NOT NULL,
    ts DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS sbx_loop_calls_session ON sbx_loop_calls (tenant, session, id);
CREATE INDEX IF NOT EXISTS sbx_loop_calls_ts ON sbx_loop_calls (ts);
CREATE TABLE IF NOT EXISTS sbx_loop_sessions (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    tripped BOOLEAN NOT NULL DEFAULT FALSE,
    since_id BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, session)
);
