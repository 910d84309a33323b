"""The state store's schema: ordered SQL steps and the version table that records them.

A small runner rather than Alembic (docs/state.md, "Why not Alembic"): the store speaks SQL
through psycopg and sqlite3 with no ORM, so Alembic would bring SQLAlchemy for nothing but its
version table. Each dialect has a folder of files `NNNN_name.sql` (migrations/postgresql,
migrations/sqlite) with the same numbers; `sbx_schema` holds one row per step applied. Steps
run in one transaction (PostgreSQL's DDL is transactional; SQLite's too), under a lock so two
replicas migrating at once apply each step once. Steps only ever go forward; a database at a
newer version than the code is refused, never read.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Literal

from sandbox.errors import ErrorCode, SandboxError

Dialect = Literal["postgresql", "sqlite"]

VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS sbx_schema (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied TEXT NOT NULL
)
"""


@dataclass(frozen=True)
class Step:
    """One schema step: its number, its name and the SQL it runs."""

    version: int
    name: str
    sql: str


@dataclass(frozen=True)
class MigrationReport:
    """What `migrate` did: the version before and after, and the steps applied."""

    before: int
    after: int
    applied: tuple[str, ...]


def steps(dialect: Dialect) -> tuple[Step, ...]:
    """Every step of `dialect`, in order.

    Raises:
        SandboxError: INTERNAL when the packaged files are not numbered 1, 2, 3... (a packaging bug).
    """
    folder = resources.files("sandbox.state.migrations").joinpath(dialect)
    found: list[Step] = []
    for entry in folder.iterdir():
        name = entry.name
        if not name.endswith(".sql"):
            continue
        number, _, rest = name.partition("_")
        found.append(Step(int(number), rest.removesuffix(".sql"), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda s: s.version)
    if [s.version for s in found] != list(range(1, len(found) + 1)):
        raise SandboxError(ErrorCode.INTERNAL, f"the {dialect} schema steps are not numbered 1..N: {found}")
    return tuple(found)


def head(dialect: Dialect) -> int:
    """The schema version this code reads and writes."""
    return len(steps(dialect))


def pending(dialect: Dialect, current: int, target: int | None, where: str) -> tuple[Step, ...]:
    """The steps that take a database at `current` to `target` (None: this code's version).

    Raises:
        SandboxError: INVALID_ARGUMENTS when the database is newer than the code or the target
            is below the database (steps only go forward) or past the code's last step.
    """
    last = head(dialect)
    goal = last if target is None else target
    if current > last:
        raise newer_than_code(where, current, last)
    if not 0 <= goal <= last:
        raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"no schema version {goal}: this code knows 1 to {last}")
    if goal < current:
        raise SandboxError(
            ErrorCode.INVALID_ARGUMENTS,
            f"the state store at {where} is at schema version {current}; steps only go forward (asked for {goal})",
        )
    return tuple(s for s in steps(dialect) if current < s.version <= goal)


def newer_than_code(where: str, current: int, last: int) -> SandboxError:
    """The error for a database a newer version of the code has migrated."""
    return SandboxError(
        ErrorCode.SERVICE_UNAVAILABLE,
        f"the state store at {where} is at schema version {current}, newer than this code's {last}: "
        "a newer agent-sandbox migrated it; run that version (or point state.url at another database)",
        schema_version=current,
        code_version=last,
    )


def check_version(where: str, dialect: Dialect, current: int) -> None:
    """Refuse a database that is not at this code's version (the store never reads another schema).

    Raises:
        SandboxError: SERVICE_UNAVAILABLE naming the version found, the one needed and the fix.
    """
    last = head(dialect)
    if current > last:
        raise newer_than_code(where, current, last)
    if current < last:
        found = "has no schema yet" if current == 0 else f"is at schema version {current}"
        raise SandboxError(
            ErrorCode.SERVICE_UNAVAILABLE,
            f"the state store at {where} {found}; this code needs version {last}: run `sandbox state migrate`",
            schema_version=current,
            code_version=last,
        )
