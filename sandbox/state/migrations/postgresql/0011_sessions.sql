-- The sessions registry of every replica (sessions/shared_registry.py): sub-agents' lineage,
-- their inboxes and the cascades of closing, so a sub-agent spawned through one replica is
-- known, messaged and closed through any other. The columns are the embedded registry's.
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
    created_at DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL,
    closed_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS sbx_lineage_parent ON sbx_lineage (tenant, parent);
CREATE INDEX IF NOT EXISTS sbx_lineage_agent ON sbx_lineage (tenant, agent);
CREATE TABLE IF NOT EXISTS sbx_inbox (
    id BIGSERIAL PRIMARY KEY,
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    sender TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS sbx_inbox_session ON sbx_inbox (tenant, session, id);
CREATE TABLE IF NOT EXISTS sbx_cascades (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    agent TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, key)
);
