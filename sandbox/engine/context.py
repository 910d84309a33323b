"""The context of one tool call, visible to handlers and logs through a contextvar."""

from __future__ import annotations

import secrets
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskContext:
    """Who is calling what: set for the duration of each call."""

    trace_id: str
    call_id: str
    tenant: str
    agent: str
    session: str
    tool: str
    sender: str | None = None


current: ContextVar[TaskContext | None] = ContextVar("sandbox_task_context", default=None)


def new_id(prefix: str) -> str:
    """A short random id such as `c-1a2b3c4d5e6f`."""
    return f"{prefix}-{secrets.token_hex(6)}"
