"""The SQLite store's schema: its version and the migration, run when the store opens (embedded:
nothing to run by hand) and by `sandbox state migrate` (see state/migrate.py)."""

from __future__ import annotations

import sqlite3

from sandbox.state.migrate import VERSION_TABLE, MigrationReport, pending


def statements(sql: str) -> list[str]:
    """A script's statements one by one (`executescript` would commit halfway through a step)."""
    out: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                out.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(ln.strip().startswith("--") or not ln.strip() for ln in buffer.splitlines()):
        out.append(buffer.strip())
    return out


def current_version(db: sqlite3.Connection) -> int:
    """The version recorded in `sbx_schema` (0 when the table does not exist)."""
    row = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'sbx_schema'").fetchone()
    if row is None:
        return 0
    return int(db.execute("SELECT coalesce(max(version), 0) FROM sbx_schema").fetchone()[0])


def migrate(db: sqlite3.Connection, where: str, target: int | None = None) -> MigrationReport:
    """Bring the database to `target` (None: this code's version) in one write transaction.

    Args:
        db: a connection in autocommit mode (`isolation_level=None`).
        where: the file, for messages.

    Raises:
        SandboxError: as :func:`sandbox.state.migrate.pending`; sqlite3.Error is the caller's to map.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(VERSION_TABLE)
        before = current_version(db)
        todo = pending("sqlite", before, target, where)
        for step in todo:
            for statement in statements(step.sql):
                db.execute(statement)
            db.execute(
                "INSERT INTO sbx_schema (version, name, applied) VALUES (?, ?, datetime('now'))",
                (step.version, step.name),
            )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    after = todo[-1].version if todo else before
    return MigrationReport(before, after, tuple(f"{s.version:04d}_{s.name}" for s in todo))
