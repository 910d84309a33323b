"""Connections to the PostgreSQL store, with every failure mapped to one clear SandboxError.

An unreachable server, refused credentials or a missing database is SERVICE_UNAVAILABLE naming
the URL (password masked) and libpq's reason, never a traceback; psycopg missing is a hint to
install the `postgres` extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import anyio

from sandbox.config.state import StateUrl
from sandbox.errors import ErrorCode, SandboxError

if TYPE_CHECKING:
    import psycopg

CONNECT_TIMEOUT_S = 5
# the server's clock (epoch seconds): the one every replica's prune cutoffs are taken on
DATABASE_NOW = "SELECT extract(epoch FROM clock_timestamp())::float8"


def psycopg_module() -> Any:
    """psycopg, or the error that says how to get it.

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the `postgres` extra is not installed.
    """
    try:
        return importlib.import_module("psycopg")
    except ImportError as exc:
        raise SandboxError(
            ErrorCode.SERVICE_UNAVAILABLE,
            "state.url names PostgreSQL, but psycopg is not installed: pip install 'agent-sandbox[postgres]'",
        ) from exc


def unreachable(url: StateUrl, exc: BaseException) -> SandboxError:
    """The error for a store that cannot be reached or refuses us (libpq's reason, first lines)."""
    reason = _without_secrets(url.url, " ".join(str(exc).split()))[:500] or type(exc).__name__
    return SandboxError(
        ErrorCode.SERVICE_UNAVAILABLE,
        f"the state store at {url.shown} cannot be used: {reason}",
        url=url.shown,
    )


# a listening connection whose server vanished without a word (a failover, a partition) is
# found dead within about half a minute and made again, not after the system's two hours
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


async def connect(url: StateUrl, *, autocommit: bool = True) -> psycopg.AsyncConnection[Any]:
    """One connection to the store (the caller closes it).

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the server is unreachable or refuses the login.
    """
    pg = psycopg_module()
    try:
        conn: psycopg.AsyncConnection[Any] = await pg.AsyncConnection.connect(
            url.url,
            autocommit=autocommit,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name="agent-sandbox",
            **KEEPALIVES,
        )
    except pg.Error as exc:
        raise unreachable(url, exc) from exc
    return conn


async def close_shielded(conn: Any) -> None:
    """Close a connection even when the closing task is being cancelled (a close that a cancel
    interrupts leaves the session open on the server until the object is collected)."""
    with anyio.CancelScope(shield=True):
        await conn.close()


def _without_secrets(url: str, reason: str) -> str:
    """libpq's reason with the URL's passwords (as written and decoded) replaced: a malformed one
    is quoted whole in its complaint ("invalid percent-encoded token: ...")."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return reason
    secrets = [parts.password or ""]
    items = (item.partition("=") for item in parts.query.split("&"))
    secrets += [value for name, _, value in items if "password" in unquote(name).lower()]
    for secret in sorted({s for raw in secrets for s in (raw, unquote(raw)) if len(s) >= 3}, key=len, reverse=True):
        reason = reason.replace(secret, "***")
    return reason
