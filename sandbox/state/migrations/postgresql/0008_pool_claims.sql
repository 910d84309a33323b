-- Claims of warm-pool members (runtime/docker/pool.py), shared by every replica on one engine:
-- each replica keeps its claim files in its own state dir, so without this two replicas could
-- hand one pooled container to two sessions. A claim is one INSERT; claims ten minutes old go (a
-- claimed member was renamed to its session long before).
CREATE TABLE IF NOT EXISTS sbx_pool_claims (
    container_id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS sbx_pool_claims_at ON sbx_pool_claims (at);
