"""`state.url`: where the state replicas must agree on lives (docs/state.md).

Absent or `sqlite:` means today's files in `state_dir` (nothing to install); a
`postgresql://user@host:port/db` URL means the shared store of several service replicas. The
environment variable `SANDBOX_STATE_URL` wins over the file (a deployment keeps the URL, and its
password, in a Secret while every replica reads the same config file).

Only the form is checked here (a load error naming `state.url`); whether the server answers,
the credentials hold and the schema is this code's is checked when the store opens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Literal
from urllib.parse import SplitResult, unquote, urlsplit

from pydantic import BeforeValidator, Field

from sandbox.config.base import StrictModel

ENV_VAR = "SANDBOX_STATE_URL"
_PG_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True)
class StateUrl:
    """A parsed `state.url`: its kind and the text libpq reads."""

    kind: Literal["sqlite", "postgresql"]
    url: str  # as written (may hold a password: never logged, see `shown`)

    @property
    def shown(self) -> str:
        """The URL with any password masked: what messages and logs may print."""
        return mask_password(self.url)


def _secret_item(item: str) -> bool:
    """A query item naming a password (`password=`, `sslpassword=`, percent-encoded or not)."""
    return "password" in unquote(item.split("=", 1)[0]).lower()


def mask_password(url: str) -> str:
    """`postgresql://u:secret@h/db` -> `postgresql://u:***@h/db` (and `password=`,
    `sslpassword=` or any other query item whose name holds "password").

    The user's part ends at the URL's last `@`, read as text: a password written with `/`, `?`,
    `#` or `@` unencoded makes a URL parser end the host early and show the rest as a path."""
    start = url.find("://") + 3
    at = url.rfind("@")
    if start >= 3 and at > start and ":" in url[start:at]:
        url = f"{url[:start]}{url[start:at].split(':', 1)[0]}:***{url[at:]}"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    items = [item for item in parts.query.split("&") if item]
    if not any(_secret_item(item) for item in items):
        return url
    query = "&".join((f"{item.split('=', 1)[0]}=***" if _secret_item(item) else item) for item in items)
    return SplitResult(parts.scheme, parts.netloc, parts.path, query, parts.fragment).geturl()


def parse_state_url(value: str) -> StateUrl:
    """Check a `state.url` value's form.

    Raises:
        ValueError: the URL is not `sqlite:` or a `postgresql://` URL naming a database.
    """
    text = value.strip()
    if text in ("sqlite:", "sqlite", "sqlite://"):
        return StateUrl("sqlite", "sqlite:")
    expected = "expected `sqlite:` or postgresql://USER@HOST:PORT/DATABASE"
    try:
        parts = urlsplit(text)
        port = parts.port  # raises on a port that is not a number
    except ValueError as exc:
        shown = mask_password(text)
        # the parser's words quote the part they could not read: a password's piece, maybe
        why = str(exc) if shown == text else "its host or port does not parse"
        raise ValueError(f"{expected} ({why}; got {shown!r})") from None
    if parts.scheme not in _PG_SCHEMES:
        raise ValueError(f"{expected} (got {mask_password(text)!r})")
    if parts.password is not None and ("@" in parts.path or "/" in f"{parts.query}#{parts.fragment}".partition("@")[2]):
        # `u:p@ss/w?rd@h/db`: a parser reads host `ss` and path `/w`; libpq reads it otherwise
        raise ValueError(f"{expected}: percent-encode `/ ? # @` in the password (got {mask_password(text)!r})")
    database = parts.path.lstrip("/")
    if not database or "/" in database:
        raise ValueError(f"{expected}: the URL names no database (got {mask_password(text)!r})")
    if port == 0:
        raise ValueError(f"{expected}: port 0 (got {mask_password(text)!r})")
    return StateUrl("postgresql", text)


def _check(value: object) -> object:
    if isinstance(value, str):
        parse_state_url(value)
    return value


class StateSection(StrictModel):
    """`state:`: the store behind journal, approvals and quotas (docs/state.md)."""

    # absent/`sqlite:` = the files in state_dir; `postgresql://...` = the shared store of several replicas
    url: Annotated[str, BeforeValidator(_check)] | None = None
    # a replica is gone when it has not renewed its lease for this long (PostgreSQL): its quota
    # reservations go back, its running calls are adopted or settled by another replica
    lease_s: float = Field(60.0, ge=5, le=3600)

    def parsed(self) -> StateUrl:
        """The URL in force: `SANDBOX_STATE_URL` when set, else `state.url`, else `sqlite:`.

        Raises:
            ValueError: `SANDBOX_STATE_URL` is malformed (the loader checks it at load time).
        """
        env = os.environ.get(ENV_VAR)
        if env:
            return parse_state_url(env)
        return parse_state_url(self.url) if self.url else StateUrl("sqlite", "sqlite:")
