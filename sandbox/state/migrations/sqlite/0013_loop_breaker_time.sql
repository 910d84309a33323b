-- A loop breaker's time (kept in step with postgresql/0013_loop_breaker_time.sql). The embedded
-- default keeps breakers in the journal (journal/loops.py, its own `ts` since journal schema 6).
ALTER TABLE sbx_loop_sessions ADD COLUMN ts REAL NOT NULL DEFAULT 0;
UPDATE sbx_loop_sessions SET ts = CAST(strftime('%s', 'now') AS REAL);
CREATE INDEX IF NOT EXISTS sbx_loop_sessions_ts ON sbx_loop_sessions (ts);
