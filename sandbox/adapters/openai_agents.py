"""The OpenAI Agents SDK (`openai-agents`): one session's tools as `FunctionTool`s.

A tool's failure is returned as the tool's output (`error: CODE: message`), as the SDK's own
default failure handler does, so the run goes on and the model can act on it. Schemas are passed
as they are (`strict_json_schema=False`: the SDK's strict mode wants every property required).
Install: `pip install 'agent-sandbox[openai-agents]'`.
"""

from __future__ import annotations

import json
from typing import Any

from agents import FunctionTool, Tool

from sandbox.adapters.common import ToolSpec, error_text, output_text, tool_specs


async def openai_agents_tools(session: Any) -> list[Tool]:
    """The session's tools (exactly what its policy offers) for `Agent(..., tools=...)`."""
    return [_tool(session, spec) for spec in await tool_specs(session)]


def _tool(session: Any, spec: ToolSpec) -> FunctionTool:
    async def invoke(_context: Any, arguments_json: str) -> str:
        try:
            arguments = json.loads(arguments_json) if arguments_json else {}
        except json.JSONDecodeError as exc:
            return f"error: INVALID_ARGUMENTS: the arguments are not JSON ({exc.msg}); send a JSON object"
        result = await session.call(spec.name, arguments)
        return output_text(result) if result.error is None else f"error: {error_text(result)}"

    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=spec.parameters,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )
