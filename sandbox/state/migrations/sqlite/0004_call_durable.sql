-- Kept in step with postgresql/0004_call_durable.sql (the embedded default keeps durable calls'
-- process ids in the journal's events instead).
ALTER TABLE calls ADD COLUMN durable TEXT;
