"""Tenants of the service: bearer tokens (stored hashed, compared in constant time) and agents.

A token is 32 random bytes, URL-safe; only its SHA-256 is kept, in the config
(`tenants[].tokens[].sha256`) or in the state dir's `tenant-tokens.json` (written by
`sandbox tenants token create`, 0600). Checking a token compares its hash with every known hash,
each in constant time, and does not stop at the first match.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio

from sandbox.api.token_file import TOKEN_FILE as TOKEN_FILE  # re-exported: where callers found it
from sandbox.api.token_file import read_tokens, tokens_locked, write_tokens
from sandbox.config.merge import EffectiveAgent, default_agent_id, effective_agent
from sandbox.config.models import Config, TenantConfig
from sandbox.errors import UsageError
from sandbox.state.admin import shared_tokens

T = TypeVar("T")
TOKEN_PREFIX = "sbx_"  # noqa: S105 - a prefix, not a secret


@dataclass(frozen=True)
class Caller:
    """An authenticated tenant."""

    tenant: TenantConfig
    token_name: str


def token_hash(token: str) -> str:
    """The SHA-256 (hex) a token is stored as."""
    return hashlib.sha256(token.encode()).hexdigest()


def _stored(state_dir: Path) -> list[dict[str, str]]:
    """The state dir's token hashes as a running service reads them (see api/token_file.py)."""
    return read_tokens(state_dir, strict=False)


def create_token(config: Config, tenant_id: str, name: str) -> str:
    """A new token for `tenant_id`: returned once, only its hash kept: in the state dir's token
    file (0600), or with a PostgreSQL `state.url` in the shared store (every replica takes it).

    Raises:
        UsageError: an unknown tenant, or a name it already uses.
        StateError: the token file is damaged (it is left as it is).
        SandboxError: SERVICE_UNAVAILABLE when the shared store cannot be used.
    """
    _known_tenant(config, tenant_id)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    url = config.state.parsed()
    if url.kind == "postgresql":
        anyio.run(
            shared_tokens, url, config.state_dir, lambda store: store.add_token(tenant_id, name, token_hash(token))
        )
        return token
    with tokens_locked(config.state_dir):  # a token made meanwhile by another process is kept
        stored = list(read_tokens(config.state_dir, strict=True))  # a damaged file is an error, never overwritten
        if any(t.get("tenant") == tenant_id and t.get("name") == name for t in stored):
            raise UsageError(f"tenant {tenant_id!r} already has a token named {name!r}")
        stored.append({"tenant": tenant_id, "name": name, "sha256": token_hash(token)})
        write_tokens(config.state_dir, stored)
    return token


def revoke_token(config: Config, tenant_id: str, name: str) -> None:
    """Remove `tenant_id`'s token `name`: from the shared store (a PostgreSQL `state.url`) and
    from the state dir's token file, wherever it is: a running service refuses it from its next
    request (every replica, for one in the store; this host's, for one in its file).

    Raises:
        UsageError: an unknown tenant, or no stored token of that name (a token under
            tenants[].tokens in the config goes by editing the config).
    """
    _known_tenant(config, tenant_id)
    url = config.state.parsed()
    removed = False
    if url.kind == "postgresql":
        removed = anyio.run(shared_tokens, url, config.state_dir, lambda store: store.remove_token(tenant_id, name))
    with tokens_locked(config.state_dir):
        stored = list(read_tokens(config.state_dir, strict=True))
        kept = [t for t in stored if not (t.get("tenant") == tenant_id and t.get("name") == name)]
        if len(kept) != len(stored):
            write_tokens(config.state_dir, kept)
            removed = True
    if not removed:
        raise UsageError(
            f"tenant {tenant_id!r} has no stored token named {name!r} (`sandbox tenants token list` shows them; "
            "a token under tenants[].tokens in the config goes by editing the config)"
        )


def stored_tokens(config: Config) -> list[dict[str, str]]:
    """The stored tokens ({tenant, name, sha256, where}): the shared store's (with a PostgreSQL
    `state.url`: `where` is "store") and the state dir's token file's (`where`: "file", which a
    service of this host takes too).

    Raises:
        StateError: the token file is damaged.
        SandboxError: SERVICE_UNAVAILABLE when the shared store cannot be used.
    """
    url = config.state.parsed()
    found: list[dict[str, str]] = []
    if url.kind == "postgresql":
        found = [{**t, "where": "store"} for t in anyio.run(shared_tokens, url, config.state_dir, lambda s: s.tokens())]
    return found + [{**t, "where": "file"} for t in read_tokens(config.state_dir, strict=True)]


def _known_tenant(config: Config, tenant_id: str) -> None:
    if not any(t.id == tenant_id for t in config.tenants):
        known = ", ".join(t.id for t in config.tenants) or "none"
        raise UsageError(f"unknown tenant {tenant_id!r}; tenants in the config: {known}")


def tenant_agents(config: Config, tenant: str) -> list[EffectiveAgent]:
    """The agents of one tenant (the implicit `main` belongs to `default`)."""
    if not config.agents.list:
        return [effective_agent(config, "main")] if tenant == "default" else []
    return [effective_agent(config, a.id) for a in config.agents.list if a.tenant == tenant]


def default_agent(config: Config, tenant: str) -> EffectiveAgent | None:
    """The tenant's default agent: the one marked `default`, else its first."""
    agents = tenant_agents(config, tenant)
    flagged = {c.id for c in config.agents.list if c.tenant == tenant and c.default}
    ordered = [a for a in agents if a.id in flagged] + agents
    return ordered[0] if ordered else None


def authenticate(config: Config, token: str | None) -> Caller | None:
    """The tenant a bearer token belongs to, or None (no early exit on a match)."""
    return Tenants(config).authenticate(token)


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for anything else."""
    scheme, _, token = (header or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def first_match(token: str | None, hashes: list[tuple[T, str]]) -> T | None:
    """What the first of `hashes` (item, sha256) matching `token` names: the token's hash is
    compared with every one, in constant time, with no early exit on a match."""
    if not token:
        return None
    digest = token_hash(token).encode()
    found: T | None = None
    for item, stored_hash in hashes:
        if hmac.compare_digest(digest, stored_hash.encode()) and found is None:
            found = item
    return found


class Tenants:
    """The tenants of one config as the service asks for them on every request: by token, and
    their agents. Merged once (a merge per request was a tenth of a millisecond), so the config
    must not change under it; the state dir's token file is read again whenever it changes."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._by_id = {t.id: t for t in config.tenants}
        self._configured = [(Caller(t, k.name), k.sha256) for t in config.tenants for k in t.tokens]
        self._candidates: tuple[object, object, list[tuple[Caller, str]]] = (None, None, self._configured)
        self._metrics = [(True, k.sha256) for k in config.service.metrics_tokens]
        self._agents: dict[str, dict[str, EffectiveAgent]] = {}
        self._shared: list[dict[str, str]] = []  # the shared store's tokens (api/shared_tokens.py)

    def take_shared(self, tokens: list[dict[str, str]]) -> None:
        """The shared store's tokens from now on (a new list: the old one is no longer taken)."""
        self._shared = list(tokens)

    def _known_hashes(self) -> list[tuple[Caller, str]]:
        stored = _stored(self.config.state_dir)  # the same list object while the file is unchanged
        shared = self._shared
        if self._candidates[0] is not stored or self._candidates[1] is not shared:
            extra = [
                (Caller(self._by_id[s["tenant"]], s.get("name", "")), s.get("sha256", ""))
                for s in [*stored, *shared]
                if s.get("tenant") in self._by_id
            ]
            self._candidates = (stored, shared, self._configured + extra)
        return self._candidates[2]

    def authenticate(self, token: str | None) -> Caller | None:
        """The tenant a bearer token belongs to, or None: its hash is compared with every known
        hash in constant time, with no early exit on a match."""
        return first_match(token, self._known_hashes())

    def holder(self, tenant: str, token_name: str, sha_prefix: str) -> Caller | None:
        """The tenant's token named `token_name` whose sha256 starts with `sha_prefix` (at least 16
        hex digits), while it is known: a revoked one is not, nor one made again under its name."""
        if len(sha_prefix) < 16:
            return None
        for caller, digest in self._known_hashes():
            if caller.tenant.id == tenant and caller.token_name == token_name and digest.lower().startswith(sha_prefix):
                return caller
        return None

    def from_authorization(self, header: str | None) -> Caller | None:
        """The tenant of an `Authorization: Bearer <token>` header; None for anything else."""
        return self.authenticate(bearer_token(header))

    def may_read_metrics(self, header: str | None) -> bool:
        """Whether the header carries one of `service.metrics_tokens` (every one compared, in
        constant time); True when none is configured. A tenant's token never does: /metrics
        names every tenant."""
        if not self._metrics:
            return True
        return first_match(bearer_token(header), self._metrics) is True

    def agents(self, tenant: str) -> dict[str, EffectiveAgent]:
        """The tenant's agents by id, its default first (see `default_agent`)."""
        found = self._agents.get(tenant)
        if found is None:
            ordered = [default_agent(self.config, tenant), *tenant_agents(self.config, tenant)]
            found = {a.id: a for a in ordered if a is not None}
            self._agents[tenant] = found
        return found

    def default_agent(self, tenant: str) -> EffectiveAgent | None:
        """The agent of a request that names none (config.merge.default_agent_id): the tenant's
        `default: true`, else its only agent; None when it has none.

        Raises:
            UsageError: several agents, none marked default (the message lists them).
        """
        agents = self.agents(tenant)
        return agents[default_agent_id(self.config, tenant)] if agents else None
