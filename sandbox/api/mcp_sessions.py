"""MCP sessions of the service: each belongs to the tenant and the token that opened it, and a
tenant holds a bounded number of them.

The SDK's session manager already refuses a session to any principal but the one that made it
(it answers 404, as for an unknown id) when the request carries an authenticated user; the
service sets that user from the bearer token (tenant and token hash). It bounds sessions only in
all; the per-tenant bound is checked where the SDK admits a session, under its creation lock, so
simultaneous opening requests cannot pass it together.
"""

from __future__ import annotations

from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from sandbox.api.tenants import Caller, bearer_token, token_hash


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
        self, app: Any, *, per_tenant: int, json_response: bool, session_idle_timeout: float, max_sessions: int
    ) -> None:
        super().__init__(
            app, json_response=json_response, session_idle_timeout=session_idle_timeout, max_sessions=max_sessions
        )
        self.per_tenant = per_tenant

    def held_by(self, tenant: str) -> int:
        """Sessions of `tenant` open now."""
        return sum(1 for owner in self._session_owners.values() if tenant_of_owner(owner["client_id"]) == tenant)

    def _admit_session(self, requestor: Any) -> Any:
        # the SDK calls this under its session-creation lock: the check and the take are one step;
        # None makes the SDK answer 503 (the service's own 429 comes first, see mcp_server.guarded)
        if requestor is None or self.held_by(tenant_of_owner(requestor["client_id"])) >= self.per_tenant:
            return None
        return super()._admit_session(requestor)
