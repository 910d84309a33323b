"""MCP sessions of the service: each belongs to the tenant and the token that opened it, and a
tenant holds a bounded number of them.

The SDK's session manager already refuses a session to any principal but the one that made it
(it answers 404, as for an unknown id) when the request carries an authenticated user; the
service sets that user from the bearer token (tenant and token hash). It bounds sessions only in
all; the per-tenant bound is checked where the SDK admits a session, under its creation lock, so
simultaneous opening requests cannot pass it together.

When a session ends (its client's DELETE, the idle timeout, or a failed opening request) the
service is told (`on_end`): the orchestrator session it used by default is closed and its
`max_sessions` place given back (api/mcp_server.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from sandbox._log import logger
from sandbox.api.tenants import Caller, bearer_token, token_hash

END_WAIT_S = 30.0  # how long an ended session's clean-up (removing its sandbox) may take


def owner_of(who: Caller, authorization: str | None) -> AuthenticatedUser:
    """The principal an MCP session is bound to: the tenant and the hash of the token it used."""
    digest = token_hash(bearer_token(authorization) or "")
    return AuthenticatedUser(AccessToken(token="", client_id=f"{who.tenant.id}:{digest}", scopes=[]))


def tenant_of_owner(client_id: str) -> str:
    """The tenant part of an owner's client id."""
    return client_id.partition(":")[0]


class OwnedSessions(StreamableHTTPSessionManager):
    """The SDK's session manager, with at most `per_tenant` sessions open per tenant."""

    def __init__(
        self,
        app: Any,
        *,
        per_tenant: int,
        json_response: bool,
        session_idle_timeout: float,
        max_sessions: int,
        stateless: bool = False,
    ) -> None:
        super().__init__(
            app,
            json_response=json_response,
            session_idle_timeout=None if stateless else session_idle_timeout,
            max_sessions=max_sessions,
            stateless=stateless,
        )
        self.per_tenant = per_tenant
        self.on_end: Callable[[str], Awaitable[None]] | None = None  # told each session id that ended

    def held_by(self, tenant: str) -> int:
        """Sessions of `tenant` open now."""
        return sum(1 for owner in self._session_owners.values() if tenant_of_owner(owner["client_id"]) == tenant)

    def _admit_session(self, requestor: Any) -> Any:
        # the SDK calls this under its session-creation lock: the check and the take are one step;
        # None makes the SDK answer 503 (the service's own 429 comes first, see mcp_server.guarded)
        if requestor is None or self.held_by(tenant_of_owner(requestor["client_id"])) >= self.per_tenant:
            return None
        return super()._admit_session(requestor)

    async def _discard_session(self, session_id: str, transport: Any) -> None:
        # the SDK may discard one session twice (a DELETE, then its server task's end): the
        # service is told once, however it ended; shielded, as the SDK's own terminate is, so a
        # session ended while the server stops still gives its place back
        ended = session_id in self._server_instances
        await super()._discard_session(session_id, transport)
        if ended and self.on_end is not None:
            with anyio.move_on_after(END_WAIT_S, shield=True):
                try:
                    await self.on_end(session_id)
                except Exception as exc:  # one failed clean-up must not break the SDK's bookkeeping
                    logger.bind(session=session_id[:64], reason=str(exc)).warning("mcp_session_end_failed")

    def is_open(self, session_id: str) -> bool:
        """Whether the session is open now."""
        return session_id in self._server_instances
