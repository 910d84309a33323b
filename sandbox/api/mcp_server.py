"""MCP over stdio (`sandbox mcp --agent A`): one agent's policy-filtered tools for a desktop client.

`tools/list` is exactly what the session's model may call (allowed *and* provided); `tools/call`
runs through the same engine as every other call. A tool-level failure is a result with
`isError` and the ToolResult JSON as its text, so the model can read the code and act on it.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.tools.formats import render


def build_server(session: Session) -> Server[Any]:
    """An MCP server whose tools are `session`'s."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        del ctx, params
        tools = [
            types.Tool(name=t["name"], description=t.get("description"), input_schema=t["inputSchema"])
            for t in render(session.tools(), "mcp")
        ]
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        del ctx
        result = await session.call(params.name, params.arguments or {})
        body = result.model_dump(mode="json")
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(body))],
            structured_content=body,
            is_error=not result.ok,
        )

    return Server("agent-sandbox", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(orch: Orchestrator, session: Session) -> None:
    """Serve `session` over this process's stdin/stdout until the client closes."""
    server = build_server(session)
    await orch.recover()
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
