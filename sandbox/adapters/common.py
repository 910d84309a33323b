"""What every adapter shares: the session's tools as (name, description, JSON schema), from the
library's Session or the client's AsyncClientSession alike, and a ToolResult as the text a model
reads."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any, Literal

from sandbox.tools.spec import ToolResult


@dataclass(frozen=True)
class ToolSpec:
    """One tool the session's model is offered."""

    name: str
    description: str
    parameters: dict[str, Any]


async def tool_specs(session: Any) -> list[ToolSpec]:
    """Exactly the tools the session's policy offers its model: the library's `tool_schemas()`,
    or the service's `GET /v1/tools` through the client (`tools("openai")`)."""
    if hasattr(session, "tool_schemas"):
        return [ToolSpec(s["name"], s["description"], s["parameters"]) for s in session.tool_schemas()]
    found = await session.tools("openai")
    return [
        ToolSpec(f["function"]["name"], f["function"].get("description", ""), f["function"].get("parameters", {}))
        for f in found
    ]


# who approves a call that waits for a human: the service (the call waits, for the console, the
# CLI or POST /v1/approvals/...), or the framework's own pause, before the call is sent
Approvals = Literal["service", "framework"]


async def approval_required(session: Any, name: str, arguments: dict[str, Any]) -> bool:
    """Whether the call would wait for a human: the library's `approval_required` (plain), or
    the client's (awaited: `POST .../approval-check`)."""
    found = session.approval_required(name, arguments)
    return bool(await found if inspect.isawaitable(found) else found)


def output_text(result: ToolResult) -> str:
    """A successful result as the model reads it: its output, as JSON."""
    return json.dumps(result.output, ensure_ascii=False, default=str)


def error_text(result: ToolResult) -> str:
    """A failed result as the model reads it: the code, the message, and whether to try again."""
    assert result.error is not None
    again = " (retryable: try again)" if result.error.retryable else ""
    return f"{result.error.code}: {result.error.message}{again}"
