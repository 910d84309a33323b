"""The sessions registry on PostgreSQL, for every replica (sessions/shared_registry.py makes the
embedded registry's objects of its rows): sub-agents' lineage, inboxes and cascades.

Synchronous, like the embedded SQLite registry it stands in for (its callers are synchronous):
a small pool of plain connections, each statement bounded by the same timeouts as the async
store's. A spawn checks the parent's fan-out and records the child in one transaction under an
advisory lock on the parent, so two replicas spawning under one parent at once never pass
`tools.subagents.max_children` together.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sandbox.config.state import StateUrl
from sandbox.errors import ErrorCode, SandboxError
from sandbox.state.postgres.connect import CONNECT_TIMEOUT_S, DATABASE_NOW, KEEPALIVES, psycopg_module, unreachable

LINEAGE = (
    "key, tenant, agent, parent, depth, name, task, tools, parent_view, parent_source, created_by_call, "
    "created_at, status, closed_at"
)
OPTIONS = "-c statement_timeout=15000 -c lock_timeout=5000"


class PgRegistry:
    """Rows of the shared registry, as the embedded registry's `SELECT *` gives them.

    Args:
        url: the store.
    """

    def __init__(self, url: StateUrl) -> None:
        self.url = url
        pool_module = importlib.import_module("psycopg_pool")
        self._pool = pool_module.ConnectionPool(
            url.url,
            min_size=1,
            max_size=4,
            timeout=5.0,
            open=False,
            check=pool_module.ConnectionPool.check_connection,
            kwargs={
                "autocommit": True,
                "connect_timeout": CONNECT_TIMEOUT_S,
                "application_name": "agent-sandbox",
                "options": OPTIONS,
                **KEEPALIVES,
            },
        )
        try:
            self._pool.open(wait=True, timeout=10.0)
        except (pool_module.PoolTimeout, psycopg_module().Error) as exc:
            self._pool.close()
            raise unreachable(url, exc) from exc

    def close(self) -> None:
        """Close the connections."""
        self._pool.close()

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        errors = (psycopg_module().Error, importlib.import_module("psycopg_pool").PoolTimeout)
        try:
            with self._pool.connection() as conn:
                yield conn
        except errors as exc:
            raise unreachable(self.url, exc) from exc

    def database_now(self) -> float:
        """The server's clock (epoch seconds)."""
        with self._conn() as conn:
            row = conn.execute(DATABASE_NOW).fetchone()
        return float(row[0])

    def rows(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        """The rows of one query."""
        with self._conn() as conn:
            return list(conn.execute(sql, tuple(args)).fetchall())

    def execute(self, sql: str, args: Sequence[Any]) -> None:
        """One statement."""
        with self._conn() as conn:
            conn.execute(sql, tuple(args))

    def add_child(self, row: tuple[Any, ...], *, max_children: int) -> None:
        """Record a spawned session (`row` in LINEAGE's order), its parent's fan-out checked in
        the same transaction, under a lock on the parent.

        Raises:
            SandboxError: CONFLICT when the key exists or an ancestor is closed or closing;
                QUOTA_EXCEEDED past `max_children` open children of the parent.
        """
        key, tenant, parent = row[0], row[1], row[3]
        with self._conn() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{tenant}|{parent}",))
            self._refuse_closing(conn, tenant, parent)
            (open_children,) = conn.execute(
                "SELECT count(*) FROM sbx_lineage WHERE tenant = %s AND parent = %s AND status = 'open'",
                (tenant, parent),
            ).fetchone()
            if open_children >= max_children:
                raise SandboxError(
                    ErrorCode.QUOTA_EXCEEDED,
                    f"this session already has {open_children} open sub-agent sessions "
                    f"(tools.subagents.max_children is {max_children}); close one first",
                    limit=max_children,
                )
            inserted = conn.execute(
                f"INSERT INTO sbx_lineage ({LINEAGE}) VALUES ({', '.join(['%s'] * 14)}) "  # noqa: S608 - constant
                "ON CONFLICT (key) DO NOTHING RETURNING 1",
                row,
            ).fetchone()
            if inserted is None:
                raise SandboxError(
                    ErrorCode.CONFLICT, f"a session {key!r} was already spawned; choose another name", session=key
                )

    @staticmethod
    def _refuse_closing(conn: Any, tenant: str, parent: str) -> None:
        key: str | None = parent
        while key is not None:
            if conn.execute("SELECT 1 FROM sbx_cascades WHERE tenant = %s AND key = %s", (tenant, key)).fetchone():
                raise SandboxError(
                    ErrorCode.CONFLICT, f"session {key!r} is being closed; nothing new is spawned under it"
                )
            row = conn.execute("SELECT parent, status FROM sbx_lineage WHERE key = %s", (key,)).fetchone()
            if row is None:
                return
            if row[1] == "closed":
                raise SandboxError(ErrorCode.CONFLICT, f"session {key!r} was closed; nothing new is spawned under it")
            key = row[0]

    def send(self, tenant: str, session: str, sender: str, text: str) -> tuple[int, float]:
        """Append a message; its id and time."""
        now = time.time()
        with self._conn() as conn:
            row = conn.execute(
                "INSERT INTO sbx_inbox (tenant, session, sender, text, created_at) VALUES (%s, %s, %s, %s, %s) "
                "RETURNING id",
                (tenant, session, sender, text, now),
            ).fetchone()
        return int(row[0]), now
