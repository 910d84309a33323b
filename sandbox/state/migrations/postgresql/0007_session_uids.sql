-- The uid of each session in a container sessions share (runtime/session_users.py), shared by
-- every replica: two replicas never hand one uid to two sessions of one container, and a
-- session has the same uid and record directory whichever replica runs its call. `scope` is
-- the container's registry key (its tenant and scope key, hashed); uids are never reused.
CREATE TABLE IF NOT EXISTS sbx_session_uids (
    scope TEXT NOT NULL,
    uid INTEGER NOT NULL,
    session TEXT NOT NULL,
    token TEXT NOT NULL,
    PRIMARY KEY (scope, uid),
    UNIQUE (scope, session)
);
