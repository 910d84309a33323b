"""LangChain (`langchain-core`): one session's tools as `StructuredTool`s.

A tool's failure is raised as `ToolException` with `handle_tool_error` on, which is LangChain's
way: the model gets a `ToolMessage` with `status="error"` and the error's code and message, and
the agent loop goes on. Install: `pip install 'agent-sandbox[langchain]'`.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import StructuredTool, ToolException

from sandbox.adapters.common import ToolSpec, error_text, output_text, tool_specs


async def langchain_tools(session: Any) -> list[StructuredTool]:
    """The session's tools (exactly what its policy offers) as LangChain tools; each call runs
    through the session (policy, approvals, journal, sandbox)."""
    return [_tool(session, spec) for spec in await tool_specs(session)]


def _tool(session: Any, spec: ToolSpec) -> StructuredTool:
    async def run(**arguments: Any) -> str:
        result = await session.call(spec.name, arguments)
        if result.error is not None:
            raise ToolException(error_text(result))
        return output_text(result)

    return StructuredTool.from_function(
        coroutine=run,
        name=spec.name,
        description=spec.description,
        args_schema=spec.parameters,  # the tool's own JSON schema, as the model sees it elsewhere
        handle_tool_error=True,
    )
