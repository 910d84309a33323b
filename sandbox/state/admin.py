"""What `sandbox state ...` does: migrate the store a config names, or say where it stands."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar, cast

from sandbox.config.state import StateUrl
from sandbox.state.migrate import MigrationReport, head
from sandbox.state.protocol import TokenStore

T = TypeVar("T")


@dataclass(frozen=True)
class StoreStatus:
    """Where a store stands: its kind, where it is (password masked), its version and the code's."""

    kind: str
    where: str
    version: int
    code_version: int


def _sqlite_path(state_dir: Path) -> Path:
    from sandbox.state.sqlite.store import FILE_NAME

    return state_dir / FILE_NAME


async def migrate_store(url: StateUrl, state_dir: Path, target: int | None = None) -> MigrationReport:
    """Bring the store to `target` (None: this code's version); steps only go forward.

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the store cannot be used or is newer than the
            code; INVALID_ARGUMENTS for a target behind the store.
    """
    if url.kind == "postgresql":
        from sandbox.state.postgres.schema import migrate as migrate_pg

        return await migrate_pg(url, target)
    from sandbox.state.sqlite import schema
    from sandbox.state.sqlite.store import connect, unusable

    path = _sqlite_path(state_dir)
    db = connect(path)
    try:
        return schema.migrate(db, str(path), target)
    except sqlite3.Error as exc:
        raise unusable(path, exc) from exc
    finally:
        db.close()


async def store_status(url: StateUrl, state_dir: Path) -> StoreStatus:
    """The store's schema version against this code's (reads only; a missing SQLite file is 0).

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the store cannot be reached or read.
    """
    if url.kind == "postgresql":
        from sandbox.state.postgres.connect import close_shielded, psycopg_module, unreachable
        from sandbox.state.postgres.connect import connect as connect_pg
        from sandbox.state.postgres.schema import current_version

        conn = await connect_pg(url)
        try:
            version = await current_version(conn)
        except psycopg_module().Error as exc:
            raise unreachable(url, exc) from exc
        finally:
            await close_shielded(conn)
        return StoreStatus("postgresql", url.shown, version, head("postgresql"))
    from sandbox.state.sqlite import schema
    from sandbox.state.sqlite.store import unusable

    path = _sqlite_path(state_dir)
    if not path.exists():
        return StoreStatus("sqlite", str(path), 0, head("sqlite"))
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            version = schema.current_version(db)
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise unusable(path, exc) from exc
    return StoreStatus("sqlite", str(path), version, head("sqlite"))


async def check_store(url: StateUrl, state_dir: Path) -> None:
    """Open the store once, ping it and close it: a start-up check (a shared store only; the
    SQLite store is made on first use).

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when it cannot be reached, refuses the login or has
            another schema version, with the fix.
    """
    if url.kind != "postgresql":
        return
    from sandbox.state.open import open_store

    async with open_store(url, state_dir) as store:
        await store.ping()


async def doctor_verdict(url: StateUrl, state_dir: Path) -> tuple[Literal["ok", "warn", "fail"], str, str]:
    """`sandbox doctor`'s line on the store: (ok|warn|fail, what was found, the fix or "")."""
    from sandbox.errors import SandboxError

    try:
        status = await store_status(url, state_dir)
    except SandboxError as exc:
        return "fail", exc.message, "check state.url (or SANDBOX_STATE_URL), the server and its credentials"
    where = f"{status.kind} store at {status.where}: schema {status.version}"
    if status.version > status.code_version:
        return "fail", f"{where}, newer than this code's {status.code_version}", "run the newer agent-sandbox"
    if status.version < status.code_version:
        if status.kind == "sqlite":  # embedded: it migrates itself when first opened
            return "ok", f"{where} (this code: {status.code_version}; migrated on first use)", ""
        return "fail", f"{where}, this code needs {status.code_version}", "sandbox state migrate"
    return "ok", f"{where} (current)", ""


async def shared_tokens(url: StateUrl, state_dir: Path, change: Callable[[TokenStore], Awaitable[T]]) -> T:
    """Run `change` (or a read) on the shared store's tokens (`sandbox tenants token ...` with a
    PostgreSQL `state.url`).

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the store cannot be used; whatever `change` raises.
    """
    from sandbox.state.open import open_store

    async with open_store(url, state_dir) as store:
        return await change(cast("TokenStore", store))
