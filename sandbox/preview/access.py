"""Who may open a connection to a session's port, and the opening itself (docs/preview.md).

A preview reaches only what all of these allow: the port is in the session's agent's
`sandbox.preview.ports`; the session is sandboxed and its sandbox is running (a preview never
creates one); a link names the sandbox it was made for, so a session closed and opened again
(a new container) does not revive it; the session's own user runs the server (the agent checks
the kernel's socket table: where sessions share a sandbox with uids of their own, no session
reaches another's server); at most `sandbox.preview.max_connections` are open per session.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from sandbox.errors import PortUnreachable, SandboxError

if TYPE_CHECKING:
    from sandbox.engine.orchestrator import Session
    from sandbox.runtime.protocol import PortStream, Sandbox
    from sandbox.runtime.session_users import SessionShell


class PreviewRefused(Exception):
    """Why a preview cannot be opened, as an HTTP status and a message the caller can act on."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def check_port(session: Session, port: int) -> None:
    """Refuse a port the session's agent does not list (403), or an unsandboxed session (403)."""
    allowed = session.agent.sandbox.preview.ports
    if port not in allowed:
        listed = ", ".join(map(str, allowed)) or "none"
        raise PreviewRefused(
            403,
            f"port {port} is not open to previews: {session.agent.key_path}.sandbox.preview.ports lists {listed}",
        )
    if not session.sandboxed:
        raise PreviewRefused(403, f"session {session.key!r} runs unsandboxed: previews show only sandboxed ports")


async def running_sandbox_id(session: Session) -> str:
    """The id of the session's running sandbox (404 when it has none: a preview never starts one)."""
    return (await _running(session)).id


async def _running(session: Session) -> Sandbox | SessionShell:
    box = await session.running_sandbox()
    if box is None:
        raise PreviewRefused(404, f"session {session.key!r} has no running sandbox; run a command in it first")
    return box


class Openings:
    """Connections open per session, in this process (`max_connections` each)."""

    def __init__(self) -> None:
        self._open: Counter[tuple[str, str]] = Counter()

    @asynccontextmanager
    async def port(self, session: Session, port: int, *, made_for: str | None = None) -> AsyncIterator[PortStream]:
        """A connection to the session's `port`, closed on exit.

        `made_for`: the sandbox id a link names (a link made for another sandbox is refused).

        Raises:
            PreviewRefused: 403, 404, 410 (the link's sandbox is gone), 429, 502 or 503.
        """
        check_port(session, port)
        key = (session.agent.tenant, session.key)
        limit = session.agent.sandbox.preview.max_connections
        if self._open[key] >= limit:
            raise PreviewRefused(
                429,
                f"{limit} preview connections of this session are open ({session.agent.key_path}"
                ".sandbox.preview.max_connections)",
            )
        self._open[key] += 1
        try:
            box = await _running(session)
            if made_for is not None and box.id != made_for:
                raise PreviewRefused(
                    410, "the link was made for a sandbox this session no longer has; ask for a new one"
                )
            try:
                link = await box.agent_link()
                if link is None:
                    raise PreviewRefused(503, "this sandbox has no resident agent, which previews need")
                stream = await link.open_port(port)
            except PortUnreachable as exc:
                raise PreviewRefused(
                    503 if exc.why in ("busy", "no_relay", "not_accepting") else 502, exc.message
                ) from None
            except SandboxError as exc:
                raise PreviewRefused(503, exc.message) from None
            try:
                yield stream
            finally:
                await stream.aclose()
        finally:
            self._open[key] -= 1
            if not self._open[key]:
                del self._open[key]
