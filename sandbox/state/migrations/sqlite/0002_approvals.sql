-- Approvals: a call waiting for a human; exactly one decision wins (a conditional update).
-- SQLite has no NOTIFY: a waiter in another process reads the row again every 0.1 s.
CREATE TABLE approvals (
    id TEXT PRIMARY KEY,
    call_id TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    session TEXT NOT NULL,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    decided REAL
);
CREATE INDEX approvals_pending ON approvals (created) WHERE status = 'pending';
