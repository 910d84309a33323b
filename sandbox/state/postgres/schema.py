"""The PostgreSQL store's schema: its version, and `sandbox state migrate` (see state/migrate.py)."""

from __future__ import annotations

from typing import Any

from sandbox.config.state import StateUrl
from sandbox.state.migrate import VERSION_TABLE, MigrationReport, pending
from sandbox.state.postgres.connect import close_shielded, connect, psycopg_module, unreachable

# pg_advisory_xact_lock key: two replicas migrating at once take turns (the second finds it done)
MIGRATE_LOCK = 0x5B5_0001


async def current_version(conn: Any) -> int:
    """The version recorded in `sbx_schema` (0 when the table does not exist)."""
    cur = await conn.execute("SELECT to_regclass('sbx_schema') IS NOT NULL")
    row = await cur.fetchone()
    if not row or not row[0]:
        return 0
    cur = await conn.execute("SELECT coalesce(max(version), 0) FROM sbx_schema")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def migrate(url: StateUrl, target: int | None = None) -> MigrationReport:
    """Bring the database at `url` to `target` (None: this code's version), in one transaction.

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the server cannot be used or a step fails (nothing
            applied); INVALID_ARGUMENTS for a target below the database's version;
            SERVICE_UNAVAILABLE for a database newer than the code.
    """
    pg = psycopg_module()
    conn = await connect(url, autocommit=False)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
            await conn.execute(VERSION_TABLE)
            before = await current_version(conn)
            todo = pending("postgresql", before, target, url.shown)
            for step in todo:
                await conn.execute(step.sql)
                await conn.execute(
                    "INSERT INTO sbx_schema (version, name, applied) VALUES (%s, %s, now()::text)",
                    (step.version, step.name),
                )
    except pg.Error as exc:
        raise unreachable(url, exc) from exc
    finally:
        await close_shielded(conn)
    after = todo[-1].version if todo else before
    return MigrationReport(before, after, tuple(f"{s.version:04d}_{s.name}" for s in todo))
