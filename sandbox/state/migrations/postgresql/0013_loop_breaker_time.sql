-- A loop breaker's time (of its trip or reset), so retention bounds sbx_loop_sessions too: one
-- row per tripped session was kept for good. Breakers from before this step count from it (the
-- column's default, taken when the step runs), so none is dropped because its time is unknown.
ALTER TABLE sbx_loop_sessions
    ADD COLUMN IF NOT EXISTS ts DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM now());
CREATE INDEX IF NOT EXISTS sbx_loop_sessions_ts ON sbx_loop_sessions (ts);
