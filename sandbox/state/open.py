"""Open the state store a config names: SQLite in state_dir, or PostgreSQL at `state.url`."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sandbox.config.state import StateUrl
from sandbox.journal.owners import LEASE_S, current_owner
from sandbox.state.protocol import StateStore


@asynccontextmanager
async def open_store(
    url: StateUrl, state_dir: Path, *, owner: str | None = None, lease_s: float = LEASE_S
) -> AsyncIterator[StateStore]:
    """The store behind `url`, open until the block ends (what its owner held goes back then).

    Args:
        url: `config.state.parsed()`.
        state_dir: where the SQLite store's file lives (unused for PostgreSQL).
        owner: the owner identity (default: journal/owners.py's, and for PostgreSQL one per open store).
        lease_s: how long a dead owner's reservations keep counting.

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the store cannot be reached or used, or its
            schema is another version than this code's.
    """
    if url.kind == "postgresql":
        # an owner there is one open store (a process may hold two); only its lease says it lives
        who = owner or f"{current_owner()}|{secrets.token_hex(4)}"
        from sandbox.state.postgres.store import open_postgres  # psycopg only when asked for

        async with open_postgres(url, owner=who, lease_s=lease_s) as pg:
            yield pg
    else:
        # on this host the kernel says whether an owner lives (journal/owners.py): the process is the owner
        who = owner or current_owner()
        from sandbox.state.sqlite.store import FILE_NAME, open_sqlite

        async with open_sqlite(state_dir / FILE_NAME, owner=who, lease_s=lease_s) as lite:
            yield lite
