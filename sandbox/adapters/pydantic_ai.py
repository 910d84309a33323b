"""PydanticAI: one session's tools as `pydantic_ai.Tool`s (built from their JSON schemas).

Arguments the tool refuses (`INVALID_ARGUMENTS`) raise `ModelRetry`, PydanticAI's way of asking
the model to call again with better ones; any other failure is the tool's answer (the code and
message as text), so the model can change its approach. Install:
`pip install 'agent-sandbox[pydantic-ai]'`.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import ModelRetry, Tool

from sandbox.adapters.common import ToolSpec, error_text, output_text, tool_specs
from sandbox.errors import ErrorCode


async def pydantic_ai_tools(session: Any) -> list[Tool[Any]]:
    """The session's tools (exactly what its policy offers) for `Agent(..., tools=...)`."""
    return [_tool(session, spec) for spec in await tool_specs(session)]


def _tool(session: Any, spec: ToolSpec) -> Tool[Any]:
    async def run(**arguments: Any) -> str:
        result = await session.call(spec.name, arguments)
        if result.error is None:
            return output_text(result)
        if result.error.code == ErrorCode.INVALID_ARGUMENTS:
            raise ModelRetry(error_text(result))
        return error_text(result)

    return Tool.from_schema(run, name=spec.name, description=spec.description, json_schema=spec.parameters)
