"""The OpenAI Agents SDK (`openai-agents`): one session's tools as `FunctionTool`s.

A tool's failure is returned as the tool's output (`error: CODE: message`), as the SDK's own
default failure handler does, so the run goes on and the model can act on it. Schemas are passed
as they are (`strict_json_schema=False`: the SDK's strict mode wants every property required).
With `approvals="framework"`, a call that would wait for a human (`tools.approvals`) is the
SDK's `needs_approval`: the run stops with an interruption, and once the application approves
it (`state.approve(item)`) and runs on, the call runs journaled "approved by the caller" (a
rejected one is never sent).
Install: `pip install 'agent-sandbox[openai-agents]'`.
"""

from __future__ import annotations

import json
from typing import Any

from agents import FunctionTool, Tool

from sandbox.adapters.common import Approvals, ToolSpec, approval_required, error_text, output_text, tool_specs

APPROVED = "approved in the OpenAI Agents SDK (the run's interruption)"


async def openai_agents_tools(session: Any, *, approvals: Approvals = "service") -> list[Tool]:
    """The session's tools (exactly what its policy offers) for `Agent(..., tools=...)`.

    `approvals`: "service" (a call that needs approval waits in the service, for the console or
    the API) or "framework" (the SDK's own interruption asks first; docs/adapters.md)."""
    return [_tool(session, spec, approvals) for spec in await tool_specs(session)]


def _tool(session: Any, spec: ToolSpec, approvals: Approvals) -> FunctionTool:
    async def needs(_context: Any, arguments: dict[str, Any], _call_id: str) -> bool:
        return await approval_required(session, spec.name, arguments)

    async def invoke(_context: Any, arguments_json: str) -> str:
        try:
            arguments = json.loads(arguments_json) if arguments_json else {}
        except json.JSONDecodeError as exc:
            return f"error: INVALID_ARGUMENTS: the arguments are not JSON ({exc.msg}); send a JSON object"
        # the SDK invokes a call that needed approval only once the application approved it
        framework = approvals == "framework" and isinstance(arguments, dict)
        approved = APPROVED if framework and await approval_required(session, spec.name, arguments) else None
        result = await session.call(spec.name, arguments, approved=approved)
        return output_text(result) if result.error is None else f"error: {error_text(result)}"

    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=spec.parameters,
        on_invoke_tool=invoke,
        strict_json_schema=False,
        needs_approval=needs if approvals == "framework" else False,
    )
