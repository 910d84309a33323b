"""Durable lineage of spawned sessions, their inboxes, and cascades in progress (SQLite).

One small database in the state dir, shared by every orchestrator process of the instance (WAL,
short transactions). It is written before anything it describes happens: a child's row exists
before its sandbox does, and a cascade is marked before its first child is closed, so an
orchestrator killed half-way finds the rest of the work on restart.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox._sqlite_files import private_files, use_wal
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.prune_steps import in_batches

SCHEMA = """
CREATE TABLE IF NOT EXISTS lineage (
    key TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    agent TEXT NOT NULL,
    parent TEXT NOT NULL,
    depth INTEGER NOT NULL,
    name TEXT NOT NULL,
    task TEXT NOT NULL,
    tools TEXT,
    parent_view TEXT NOT NULL,
    parent_source TEXT NOT NULL,
    created_by_call TEXT NOT NULL,
    created_at REAL NOT NULL,
    status TEXT NOT NULL,
    closed_at REAL
);
CREATE INDEX IF NOT EXISTS lineage_parent ON lineage(tenant, parent);
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    sender TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS inbox_session ON inbox(tenant, session, id);
CREATE TABLE IF NOT EXISTS cascades (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    agent TEXT NOT NULL,
    started_at REAL NOT NULL,
    PRIMARY KEY (tenant, key)
);
"""

PRUNE_BATCH = 500  # rows per delete (inbox rows hold up to 32,000 characters each)
# made by the first prune, in its worker thread, not when the registry opens (maybe on the event
# loop): on a registry of before, the build reads every message once
PRUNE_INDEXES = (
    "CREATE INDEX IF NOT EXISTS inbox_created ON inbox(created_at)",
    "CREATE INDEX IF NOT EXISTS lineage_closed ON lineage(closed_at) WHERE status = 'closed'",
)
# by the time indexes: a batch reads only what it deletes
PRUNE_INBOX = "DELETE FROM inbox WHERE id IN (SELECT id FROM inbox WHERE created_at < ? ORDER BY created_at LIMIT ?)"
PRUNE_LINEAGE = (
    "DELETE FROM lineage WHERE key IN "
    "(SELECT key FROM lineage WHERE status = 'closed' AND closed_at < ? ORDER BY closed_at LIMIT ?)"
)
PRUNE_SQL = (PRUNE_INBOX, PRUNE_LINEAGE)

INBOX = "SELECT id, session, sender, text, created_at FROM inbox WHERE tenant = ? AND session = ? AND id > ? "
INBOX_OLDEST = INBOX + "ORDER BY id ASC LIMIT ?"
INBOX_NEWEST = INBOX + "ORDER BY id DESC LIMIT ?"


@dataclass(frozen=True)
class Child:
    """One spawned session, as recorded when it was spawned."""

    key: str
    tenant: str
    agent: str
    parent: str
    depth: int
    name: str
    task: str
    tools: tuple[str, ...] | None  # the spawn's narrowing (None: the policy's tools)
    parent_view: str  # none | ro | rw
    parent_source: str  # the host folder mounted at /parent ("" for none)
    created_by_call: str
    created_at: float
    status: str  # open | closed
    closed_at: float | None


@dataclass(frozen=True)
class Message:
    """One message in a session's inbox."""

    id: int
    session: str
    sender: str
    text: str
    created_at: float


class Registry:
    """Lineage, inboxes and pending cascades of one instance.

    Args:
        path: the database file (made 0600 in a 0700 folder).
    """

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        try:
            private_files(path)  # two processes making the file at once both go on
            self._db = sqlite3.connect(str(path), timeout=10, check_same_thread=False, isolation_level=None)
            use_wal(self._db, 10)
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise SandboxError(ErrorCode.INTERNAL, f"the session registry at {path} cannot be opened: {exc}") from exc

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    def _rows(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, tuple(args)).fetchall())

    # -- lineage ---------------------------------------------------------------------------

    def add_child(self, child: Child, *, max_children: int) -> None:
        """Record a spawned session, checking the parent's fan-out in the same transaction.

        Raises:
            SandboxError: CONFLICT when the key exists; QUOTA_EXCEEDED past `max_children`
                open children of the parent.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._refuse_closing(child.tenant, child.parent)
                (open_children,) = self._db.execute(
                    "SELECT COUNT(*) FROM lineage WHERE tenant = ? AND parent = ? AND status = 'open'",
                    (child.tenant, child.parent),
                ).fetchone()
                if open_children >= max_children:
                    raise SandboxError(
                        ErrorCode.QUOTA_EXCEEDED,
                        f"this session already has {open_children} open sub-agent sessions "
                        f"(tools.subagents.max_children is {max_children}); close one first",
                        limit=max_children,
                    )
                if self._db.execute("SELECT 1 FROM lineage WHERE key = ?", (child.key,)).fetchone():
                    raise SandboxError(
                        ErrorCode.CONFLICT,
                        f"a session {child.key!r} was already spawned; choose another name",
                        session=child.key,
                    )
                self._db.execute(
                    "INSERT INTO lineage VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        child.key,
                        child.tenant,
                        child.agent,
                        child.parent,
                        child.depth,
                        child.name,
                        child.task,
                        json.dumps(list(child.tools)) if child.tools is not None else None,
                        child.parent_view,
                        child.parent_source,
                        child.created_by_call,
                        child.created_at,
                        child.status,
                        child.closed_at,
                    ),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _refuse_closing(self, tenant: str, parent: str) -> None:
        """Inside the spawn's transaction: the parent, or an ancestor, is closed or being closed."""
        key: str | None = parent
        while key is not None:
            if self._db.execute("SELECT 1 FROM cascades WHERE tenant = ? AND key = ?", (tenant, key)).fetchone():
                raise SandboxError(
                    ErrorCode.CONFLICT, f"session {key!r} is being closed; nothing new is spawned under it"
                )
            row = self._db.execute("SELECT parent, status FROM lineage WHERE key = ?", (key,)).fetchone()
            if row is None:
                return
            if row[1] == "closed":
                raise SandboxError(ErrorCode.CONFLICT, f"session {key!r} was closed; nothing new is spawned under it")
            key = row[0]

    def count_messages(self, tenant: str, session: str) -> int:
        """How many messages `session`'s inbox holds."""
        return int(self._rows("SELECT COUNT(*) FROM inbox WHERE tenant = ? AND session = ?", (tenant, session))[0][0])

    def child(self, key: str) -> Child | None:
        """The lineage row of a spawned session (None for a session nobody spawned)."""
        rows = self._rows("SELECT * FROM lineage WHERE key = ?", (key,))
        return _child(rows[0]) if rows else None

    def children(self, tenant: str, parent: str, *, include_closed: bool = False) -> list[Child]:
        """Direct children of `parent`, oldest first."""
        status = "" if include_closed else " AND status = 'open'"
        rows = self._rows(
            f"SELECT * FROM lineage WHERE tenant = ? AND parent = ?{status} ORDER BY created_at",  # noqa: S608
            (tenant, parent),
        )
        return [_child(r) for r in rows]

    def descendants(self, tenant: str, key: str, *, include_closed: bool = False) -> list[Child]:
        """Every descendant of `key` (children before their own children)."""
        return descendants_of(lambda parent: self.children(tenant, parent, include_closed=include_closed), key)

    def of_agent(self, tenant: str, agent: str) -> list[Child]:
        """Every spawned session of one agent in one tenant."""
        rows = self._rows("SELECT * FROM lineage WHERE tenant = ? AND agent = ? ORDER BY created_at", (tenant, agent))
        return [_child(r) for r in rows]

    def mark_closed(self, key: str) -> None:
        """A spawned session is closed (idempotent)."""
        with self._lock:
            self._db.execute(
                "UPDATE lineage SET status = 'closed', closed_at = ? WHERE key = ? AND status != 'closed'",
                (time.time(), key),
            )

    # -- cascades --------------------------------------------------------------------------

    def begin_cascade(self, tenant: str, key: str, agent: str) -> None:
        """Mark that closing `key` (and its descendants) has begun."""
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO cascades VALUES (?,?,?,?)",
                (tenant, key, agent, time.time()),
            )

    def end_cascade(self, tenant: str, key: str) -> None:
        """The cascade of `key` is complete."""
        with self._lock:
            self._db.execute("DELETE FROM cascades WHERE tenant = ? AND key = ?", (tenant, key))

    def pending_cascades(self) -> list[tuple[str, str, str]]:
        """(tenant, key, agent) of every cascade an orchestrator began and did not finish."""
        return [
            (r[0], r[1], r[2]) for r in self._rows("SELECT tenant, key, agent FROM cascades ORDER BY started_at", ())
        ]

    # -- retention -------------------------------------------------------------------------

    def prune(self, before: float) -> int:
        """Delete inbox messages sent before `before` (epoch s) and the lineage of sessions
        closed before it (`journal.retention.max_age`, as for the calls); how many rows went.
        Open sessions' lineage stays, whatever its age."""
        with self._lock:
            for sql in PRUNE_INDEXES:
                self._db.execute(sql)
        # one short transaction per batch, the lock let go between them: a month of messages
        # (32,000 characters each) deleted at once held every writer for seconds
        return sum(in_batches(functools.partial(self._delete, sql, before), PRUNE_BATCH) for sql in PRUNE_SQL)

    def _delete(self, sql: str, before: float, rows: int) -> int:
        with self._lock:
            return int(self._db.execute(sql, (before, rows)).rowcount)

    # -- inbox -----------------------------------------------------------------------------

    def send(self, tenant: str, session: str, sender: str, text: str) -> Message:
        """Append a message to `session`'s inbox."""
        now = time.time()
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO inbox(tenant, session, sender, text, created_at) VALUES (?,?,?,?,?)",
                (tenant, session, sender, text, now),
            )
            msg_id = int(cur.lastrowid or 0)
        return Message(msg_id, session, sender, text, now)

    def messages(
        self, tenant: str, session: str, *, after_id: int = 0, limit: int = 1000, newest: bool = False
    ) -> list[Message]:
        """`session`'s inbox in order, after `after_id` (the oldest `limit`, or with `newest` the latest)."""
        sql = INBOX_NEWEST if newest else INBOX_OLDEST
        rows = self._rows(sql, (tenant, session, after_id, limit))
        found = [Message(int(r[0]), r[1], r[2], r[3], float(r[4])) for r in rows]
        return list(reversed(found)) if newest else found


def descendants_of(children: Callable[[str], list[Child]], key: str) -> list[Child]:
    """Every descendant of `key` by `children(parent)`, breadth first (both registries walk so)."""
    out: list[Child] = []
    frontier = [key]
    while frontier:
        nxt: list[str] = []
        for parent in frontier:
            for c in children(parent):
                out.append(c)
                nxt.append(c.key)
        frontier = nxt
    return out


def _child(row: tuple[Any, ...]) -> Child:
    tools = tuple(json.loads(row[7])) if row[7] is not None else None
    return Child(
        row[0],
        row[1],
        row[2],
        row[3],
        int(row[4]),
        row[5],
        row[6],
        tools,
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
    )
