-- What a tenant holds beyond its calls, shared by every replica (api/quotas.py): its open
-- sessions (tenants[].quotas.max_sessions) and the sandboxes being made for it
-- (tenants[].quotas.max_sandboxes). Counted per process before this step, so two replicas each
-- admitted a tenant's whole quota.

-- a session key the tenant holds: open (admitted) or claimed by requests none of which was
-- admitted yet (`holders` of them; a claim older than two minutes was lost and stops counting)
CREATE TABLE IF NOT EXISTS sbx_tenant_sessions (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    admitted BOOLEAN NOT NULL,
    holders INTEGER NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, key)
);

-- a sandbox a running call is making for the tenant: it counts until the call ends (then the
-- engine's list shows it), or until its owner's lease runs out
CREATE TABLE IF NOT EXISTS sbx_sandbox_makes (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    scope_key TEXT NOT NULL,
    owner TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS sbx_sandbox_makes_tenant ON sbx_sandbox_makes (tenant);
CREATE INDEX IF NOT EXISTS sbx_sandbox_makes_owner ON sbx_sandbox_makes (owner);
