-- Approvals: a call waiting for a human; a decision through any replica wakes the waiter on
-- another at once (NOTIFY sbx_approvals, the approval's id as payload, sent by the deciding
-- transaction) and exactly one decision wins (a conditional update).
CREATE TABLE approvals (
    id TEXT PRIMARY KEY,
    call_id TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    session TEXT NOT NULL,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    -- JSON as text: byte for byte what the approver saw (jsonb refuses \u0000 and reorders keys)
    arguments TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    created DOUBLE PRECISION NOT NULL,
    decided DOUBLE PRECISION
);
CREATE INDEX approvals_pending ON approvals (created) WHERE status = 'pending';
