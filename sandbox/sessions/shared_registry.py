"""The sessions registry of several replicas: the embedded Registry's methods, over the shared
store's tables (state/postgres/registry.py), so a sub-agent spawned through one replica is
listed, messaged and closed through any other."""

from __future__ import annotations

import functools
import json
import time
from typing import TYPE_CHECKING

from sandbox.journal.prune_steps import in_batches
from sandbox.sessions.registry import PRUNE_BATCH, Child, Message, _child, descendants_of

if TYPE_CHECKING:
    from sandbox.state.postgres.registry import PgRegistry

INBOX = "SELECT id, session, sender, text, created_at FROM sbx_inbox WHERE tenant = %s AND session = %s AND id > %s "

# as the embedded registry's: batches of PRUNE_BATCH, each its own transaction, by the time indexes
PRUNE_INBOX = (
    "WITH gone AS (DELETE FROM sbx_inbox WHERE id IN "
    "(SELECT id FROM sbx_inbox WHERE created_at < %s ORDER BY created_at LIMIT %s) RETURNING 1) "
    "SELECT count(*) FROM gone"
)
PRUNE_LINEAGE = (
    "WITH gone AS (DELETE FROM sbx_lineage WHERE key IN (SELECT key FROM sbx_lineage "
    "WHERE status = 'closed' AND closed_at < %s ORDER BY closed_at LIMIT %s) RETURNING 1) "
    "SELECT count(*) FROM gone"
)
PRUNE_SQL = (PRUNE_INBOX, PRUNE_LINEAGE)


class SharedRegistry:
    """Lineage, inboxes and pending cascades of every replica (the Registry's interface).

    Args:
        rows: the store's registry tables.
    """

    def __init__(self, rows: PgRegistry) -> None:
        self._rows = rows

    def close(self) -> None:
        """Close the connections."""
        self._rows.close()

    def add_child(self, child: Child, *, max_children: int) -> None:
        """See :meth:`sandbox.sessions.registry.Registry.add_child`."""
        tools = json.dumps(list(child.tools)) if child.tools is not None else None
        row = (
            child.key, child.tenant, child.agent, child.parent, child.depth, child.name, child.task, tools,
            child.parent_view, child.parent_source, child.created_by_call, child.created_at, child.status,
            child.closed_at,
        )  # fmt: skip
        self._rows.add_child(row, max_children=max_children)

    def prune(self, before: float) -> int:
        """See :meth:`sandbox.sessions.registry.Registry.prune` (batches of PRUNE_BATCH rows, each
        its own transaction, found through the time indexes). `before` is taken as an age on
        this replica's clock and moved to the database's, so a replica whose clock runs ahead
        deletes nothing younger than the retention."""
        before += self._rows.database_now() - time.time()
        return sum(in_batches(functools.partial(self._delete, sql, before), PRUNE_BATCH) for sql in PRUNE_SQL)

    def _delete(self, sql: str, before: float, rows: int) -> int:
        return int(self._rows.rows(sql, (before, rows))[0][0])

    def count_messages(self, tenant: str, session: str) -> int:
        """See :meth:`sandbox.sessions.registry.Registry.count_messages`."""
        rows = self._rows.rows("SELECT count(*) FROM sbx_inbox WHERE tenant = %s AND session = %s", (tenant, session))
        return int(rows[0][0])

    def child(self, key: str) -> Child | None:
        """See :meth:`sandbox.sessions.registry.Registry.child`."""
        rows = self._rows.rows("SELECT * FROM sbx_lineage WHERE key = %s", (key,))
        return _child(rows[0]) if rows else None

    def children(self, tenant: str, parent: str, *, include_closed: bool = False) -> list[Child]:
        """See :meth:`sandbox.sessions.registry.Registry.children`."""
        status = "" if include_closed else " AND status = 'open'"
        rows = self._rows.rows(
            f"SELECT * FROM sbx_lineage WHERE tenant = %s AND parent = %s{status} ORDER BY created_at",  # noqa: S608
            (tenant, parent),
        )
        return [_child(r) for r in rows]

    def descendants(self, tenant: str, key: str, *, include_closed: bool = False) -> list[Child]:
        """See :meth:`sandbox.sessions.registry.Registry.descendants`."""
        return descendants_of(lambda parent: self.children(tenant, parent, include_closed=include_closed), key)

    def of_agent(self, tenant: str, agent: str) -> list[Child]:
        """See :meth:`sandbox.sessions.registry.Registry.of_agent`."""
        rows = self._rows.rows(
            "SELECT * FROM sbx_lineage WHERE tenant = %s AND agent = %s ORDER BY created_at", (tenant, agent)
        )
        return [_child(r) for r in rows]

    def mark_closed(self, key: str) -> None:
        """See :meth:`sandbox.sessions.registry.Registry.mark_closed`."""
        self._rows.execute(
            "UPDATE sbx_lineage SET status = 'closed', closed_at = %s WHERE key = %s AND status != 'closed'",
            (time.time(), key),
        )

    def begin_cascade(self, tenant: str, key: str, agent: str) -> None:
        """See :meth:`sandbox.sessions.registry.Registry.begin_cascade`."""
        self._rows.execute(
            "INSERT INTO sbx_cascades (tenant, key, agent, started_at) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (tenant, key, agent, time.time()),
        )

    def end_cascade(self, tenant: str, key: str) -> None:
        """See :meth:`sandbox.sessions.registry.Registry.end_cascade`."""
        self._rows.execute("DELETE FROM sbx_cascades WHERE tenant = %s AND key = %s", (tenant, key))

    def pending_cascades(self) -> list[tuple[str, str, str]]:
        """See :meth:`sandbox.sessions.registry.Registry.pending_cascades`."""
        rows = self._rows.rows("SELECT tenant, key, agent FROM sbx_cascades ORDER BY started_at", ())
        return [(r[0], r[1], r[2]) for r in rows]

    def send(self, tenant: str, session: str, sender: str, text: str) -> Message:
        """See :meth:`sandbox.sessions.registry.Registry.send`."""
        msg_id, now = self._rows.send(tenant, session, sender, text)
        return Message(msg_id, session, sender, text, now)

    def messages(
        self, tenant: str, session: str, *, after_id: int = 0, limit: int = 1000, newest: bool = False
    ) -> list[Message]:
        """See :meth:`sandbox.sessions.registry.Registry.messages`."""
        sql = INBOX + ("ORDER BY id DESC LIMIT %s" if newest else "ORDER BY id ASC LIMIT %s")
        rows = self._rows.rows(sql, (tenant, session, after_id, limit))
        found = [Message(int(r[0]), r[1], r[2], r[3], float(r[4])) for r in rows]
        return list(reversed(found)) if newest else found
