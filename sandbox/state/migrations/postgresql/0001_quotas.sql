-- Quota reservations and rate windows, shared by every replica (docs/state.md).
-- Times are seconds since the epoch by the database's clock, so replicas' clocks never disagree.

-- who holds reservations, and until when they count if it stops renewing (the owner's lease)
CREATE TABLE owners (
    owner TEXT PRIMARY KEY,
    lease_until DOUBLE PRECISION NOT NULL
);

-- calls running: slots toward tenants[].quotas.max_concurrent_calls
CREATE TABLE reservations (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    owner TEXT NOT NULL,
    slots INTEGER NOT NULL CHECK (slots >= 0),
    created DOUBLE PRECISION NOT NULL
);
CREATE INDEX reservations_tenant ON reservations (tenant);
CREATE INDEX reservations_owner ON reservations (owner);

-- call starts in the last minute: toward tenants[].quotas.max_calls_per_minute
CREATE TABLE call_starts (
    tenant TEXT NOT NULL,
    started DOUBLE PRECISION NOT NULL,
    reservation TEXT NOT NULL
);
CREATE INDEX call_starts_tenant ON call_starts (tenant, started);
CREATE INDEX call_starts_reservation ON call_starts (reservation);
