-- Kept in step with postgresql/0014_registry_time_indexes.sql. The embedded default keeps the
-- registry in sessions.sqlite3 (sessions/registry.py), which has the same indexes.
CREATE INDEX IF NOT EXISTS sbx_inbox_created ON sbx_inbox (created_at);
CREATE INDEX IF NOT EXISTS sbx_lineage_closed ON sbx_lineage (closed_at) WHERE status = 'closed';
