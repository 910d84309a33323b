-- The sessions registry's retention (sessions/shared_registry.py) deletes in batches found by
-- time: old messages and closed sessions' lineage, without scanning the tables. Built in the
-- step's transaction: on a large registry, writes to these two tables wait for the build.
CREATE INDEX IF NOT EXISTS sbx_inbox_created ON sbx_inbox (created_at);
CREATE INDEX IF NOT EXISTS sbx_lineage_closed ON sbx_lineage (closed_at) WHERE status = 'closed';
