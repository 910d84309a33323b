-- Tenant tokens' hashes (what `sandbox tenants token create` makes), shared by every replica:
-- a token made or revoked through any host is taken or refused by every replica at once (the
-- change sends NOTIFY sbx_tokens; api/shared_tokens.py). Only the SHA-256 of a token is kept.
CREATE TABLE IF NOT EXISTS sbx_tokens (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, name)
);
