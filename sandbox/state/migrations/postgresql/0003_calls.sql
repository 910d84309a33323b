-- Call records: a call's idempotency key (unique per tenant while kept), its state while it
-- runs and its ToolResult once it ended, so a repeat through any replica gets the same call.
-- Times are the database's clock (replicas whose clocks differ agree on every key's age).
CREATE TABLE calls (
    call_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    idem_key TEXT,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    -- the ToolResult as JSON text: returned to a repeat byte for byte
    result TEXT,
    reason TEXT NOT NULL DEFAULT '',
    created DOUBLE PRECISION NOT NULL,
    ended DOUBLE PRECISION,
    -- the store instance (replica) running it: when its lease in `owners` runs out, a call still
    -- `running` is abandoned by whoever looks (a repeat, a waiter), never waited for in vain
    owner TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX calls_key ON calls (tenant, idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX calls_created ON calls (created);
