"""The sessions tools: thin handlers over the orchestrator's sessions port (sessions/service.py)."""

from __future__ import annotations

from typing import Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.builtin import (
    SessionsHistoryArgs,
    SessionsListArgs,
    SessionsSendArgs,
    SessionsSpawnArgs,
    SessionStatusArgs,
)
from sandbox.tools.context import SessionsPort, ToolContext


def _port(ctx: ToolContext) -> SessionsPort:
    if ctx.sessions is None:
        raise SandboxError(
            ErrorCode.SERVICE_UNAVAILABLE,
            "the sessions tools keep lineage and history in the journal; this orchestrator runs without one",
        )
    return ctx.sessions


async def sessions_spawn_tool(ctx: ToolContext, args: SessionsSpawnArgs) -> dict[str, Any]:
    """Create a child session `<this>:subagent:<name>`."""
    return await _port(ctx).spawn(task=args.task, name=args.name, agent=args.agent, tools=args.tools)


async def sessions_list_tool(ctx: ToolContext, args: SessionsListArgs) -> dict[str, Any]:
    """The sessions this one may see, with status."""
    return await _port(ctx).list_sessions(limit=args.limit)


async def sessions_history_tool(ctx: ToolContext, args: SessionsHistoryArgs) -> dict[str, Any]:
    """Calls and messages of a visible session."""
    return await _port(ctx).history(session=args.session, limit=args.limit)


async def sessions_send_tool(ctx: ToolContext, args: SessionsSendArgs) -> dict[str, Any]:
    """Append a message to a visible session's inbox."""
    return await _port(ctx).send(session=args.session, text=args.text)


async def session_status_tool(ctx: ToolContext, args: SessionStatusArgs) -> dict[str, Any]:
    """This session's sandbox, policy summary, limits and usage."""
    del args
    return await _port(ctx).status()
