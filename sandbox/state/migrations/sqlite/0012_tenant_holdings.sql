-- What a tenant holds beyond its calls (kept in step with postgresql/0012_tenant_holdings.sql):
-- its open sessions toward tenants[].quotas.max_sessions. The sandboxes being made are the
-- shared store's only (the embedded default counts them in its one process); the table is here
-- so both dialects have the same steps.
CREATE TABLE IF NOT EXISTS sbx_tenant_sessions (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    admitted INTEGER NOT NULL,
    holders INTEGER NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE TABLE IF NOT EXISTS sbx_sandbox_makes (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    scope_key TEXT NOT NULL,
    owner TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sbx_sandbox_makes_tenant ON sbx_sandbox_makes (tenant);
