-- Pool claims (kept in step with postgresql/0008_pool_claims.sql). The embedded default keeps
-- them as files in the state dir (runtime/docker/pool.py); this table is here so both dialects
-- have the same steps.
CREATE TABLE IF NOT EXISTS sbx_pool_claims (
    container_id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    at REAL NOT NULL
);
