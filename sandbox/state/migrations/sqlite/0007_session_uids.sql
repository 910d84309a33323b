-- Session uids (kept in step with postgresql/0007_session_uids.sql). The embedded default keeps
-- them in the state dir's registry of small files (runtime/session_users.py); this table is here
-- so both dialects have the same steps.
CREATE TABLE IF NOT EXISTS sbx_session_uids (
    scope TEXT NOT NULL,
    uid INTEGER NOT NULL,
    session TEXT NOT NULL,
    token TEXT NOT NULL,
    PRIMARY KEY (scope, uid),
    UNIQUE (scope, session)
);
