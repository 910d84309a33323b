-- Tenant tokens (kept in step with postgresql/0006_tokens.sql). The embedded default keeps them
-- in the state dir's token file (api/token_file.py); this table is here so both dialects have
-- the same steps.
CREATE TABLE IF NOT EXISTS sbx_tokens (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (tenant, name)
);
