"""Who may use the console: operators, with tokens of their own (`service.operator_tokens`),
never a tenant's. An operator logs in once (the login page sends the token in the
`Authorization` header: no token ever travels in a form body or a URL) and gets a session cookie
(`HttpOnly`, `SameSite=Strict`, path `/ui`), kept in this process's memory (a login is one
replica's: behind a balancer, keep `/ui` sticky or log in again).

Every state change (a decision, the logout) is a POST that carries the session's CSRF token in
a form field, compared in constant time, and is refused when the browser says it came from
another site (`Origin`, `Sec-Fetch-Site`).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException, Request

from sandbox.api.bodies import mark_authenticated
from sandbox.api.tenants import bearer_token, first_match
from sandbox.config.models import ServiceSection

COOKIE = "sbx_console"
MAX_SESSIONS = 256  # live logins kept; the oldest goes first


@dataclass
class OperatorSession:
    """One operator's login."""

    operator: str
    csrf: str
    expires: float
    created: float = field(default_factory=time.monotonic)


class Operators:
    """The operator tokens' hashes and the live logins of this process."""

    def __init__(self, service: ServiceSection) -> None:
        self._hashes = [(t.name, t.sha256) for t in service.operator_tokens]
        self._lifetime_s = service.console_session_hours * 3600
        self._sessions: dict[str, OperatorSession] = {}

    @property
    def enabled(self) -> bool:
        """Whether the console is on (at least one operator token is configured)."""
        return bool(self._hashes)

    def login(self, header: str | None) -> tuple[str, OperatorSession]:
        """A new login for the operator whose token the header carries.

        Raises:
            HTTPException: 401 for anything but an operator's token (a tenant's included).
        """
        name = first_match(bearer_token(header), self._hashes)
        if name is None:
            raise HTTPException(
                401, "an operator token is required (service.operator_tokens; a tenant's token does not do)"
            )
        now = time.monotonic()
        for key, held in list(self._sessions.items()):
            if held.expires <= now:
                del self._sessions[key]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[min(self._sessions, key=lambda k: self._sessions[k].created)]
        sid = secrets.token_urlsafe(32)
        session = OperatorSession(name, secrets.token_urlsafe(32), now + self._lifetime_s)
        self._sessions[sid] = session
        return sid, session

    def logout(self, sid: str) -> None:
        self._sessions.pop(sid, None)

    def of(self, request: Request) -> OperatorSession | None:
        """The login of this request's cookie, or None."""
        sid = request.cookies.get(COOKIE)
        if not sid:
            return None
        found = self._sessions.get(sid)
        if found is None or found.expires <= time.monotonic():
            self._sessions.pop(sid, None)
            return None
        mark_authenticated(request.scope)  # an operator's request: its (small) body may be read
        return found

    @property
    def lifetime_s(self) -> float:
        return self._lifetime_s


def same_site(request: Request) -> bool:
    """Whether the browser says the request came from this site: `Sec-Fetch-Site` when it sends
    one, else a real `Origin` (not `null`) that names this host; a request saying neither is let
    through to the CSRF token, which every state change needs anyway."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return True
    return origin.split("://", 1)[-1] == request.headers.get("host", "")


def check_csrf(session: OperatorSession, form: dict[str, Any], request: Request) -> None:
    """Refuse a state change without this login's CSRF token, or from another site.

    Raises:
        HTTPException: 403.
    """
    token = form.get("csrf")
    if not isinstance(token, str) or not hmac.compare_digest(token.encode(), session.csrf.encode()):
        raise HTTPException(403, "the form's CSRF token is missing or wrong; reload the page")
    if not same_site(request):
        raise HTTPException(403, "a request from another site is refused")
