-- Small records of one session every replica serving it must see (its background processes:
-- tools/process_table.py), as text by kind and key.
CREATE TABLE IF NOT EXISTS sbx_session_records (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, session, kind, key)
);
