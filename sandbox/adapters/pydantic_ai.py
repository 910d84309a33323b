"""PydanticAI: one session's tools as `pydantic_ai.Tool`s (built from their JSON schemas).

Arguments the tool refuses (`INVALID_ARGUMENTS`) raise `ModelRetry`, PydanticAI's way of asking
the model to call again with better ones; any other failure is the tool's answer (the code and
message as text), so the model can change its approach. With `approvals="framework"`, a call
that would wait for a human (`tools.approvals`) raises `ApprovalRequired` first: the run ends
with `DeferredToolRequests`, and once the application resumes it with the human's
`DeferredToolResults`, an approved call runs journaled "approved by the caller" (a denied one is
never sent). Install: `pip install 'agent-sandbox[pydantic-ai]'`.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import ApprovalRequired, ModelRetry, RunContext, Tool

from sandbox.adapters.common import Approvals, ToolSpec, approval_required, error_text, output_text, tool_specs
from sandbox.errors import ErrorCode

APPROVED = "approved in PydanticAI (the run's DeferredToolResults)"


async def pydantic_ai_tools(session: Any, *, approvals: Approvals = "service") -> list[Tool[Any]]:
    """The session's tools (exactly what its policy offers) for `Agent(..., tools=...)`.

    `approvals`: "service" (a call that needs approval waits in the service, for the console or
    the API) or "framework" (PydanticAI's own pause asks first; docs/adapters.md)."""
    return [_tool(session, spec, approvals) for spec in await tool_specs(session)]


def _tool(session: Any, spec: ToolSpec, approvals: Approvals) -> Tool[Any]:
    async def run(ctx: RunContext[Any], **arguments: Any) -> str:
        approved = None
        if approvals == "framework" and await approval_required(session, spec.name, arguments):
            if not ctx.tool_call_approved:
                raise ApprovalRequired(metadata={"tool": spec.name, "why": "tools.approvals"})
            approved = APPROVED
        result = await session.call(spec.name, arguments, approved=approved)
        if result.error is None:
            return output_text(result)
        if result.error.code == ErrorCode.INVALID_ARGUMENTS:
            raise ModelRetry(error_text(result))
        return error_text(result)

    return Tool.from_schema(
        run, name=spec.name, description=spec.description, json_schema=spec.parameters, takes_ctx=True
    )
