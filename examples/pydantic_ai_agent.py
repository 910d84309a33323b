"""A PydanticAI agent whose tools are an agent-sandbox session's: exactly what the session's
policy allows, each call run in the session's hardened container.

Run: python examples/pydantic_ai_agent.py [STATE_DIR]   (needs the engine and `sandbox images build`)

A scripted model (`FunctionModel`) plays the LLM so this runs offline. With a real one:
`Agent("openai:gpt-4o", tools=tools)` (or any model PydanticAI supports).
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import anyio
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sandbox import Orchestrator, load_config_text
from sandbox.adapters.pydantic_ai import pydantic_ai_tools

CONFIG = """
state_dir: {state}
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: rw}}}}
  list: [{{id: coder}}]
"""

SCRIPT: list[list[Any]] = [
    [ToolCallPart("write", {"path": "hello.txt", "content": "hello from the sandbox"})],
    [ToolCallPart("exec", {"command": "cat hello.txt; id -u"})],
    [TextPart("The file says hello.")],
]


async def main(state: str) -> None:
    async with Orchestrator(load_config_text(CONFIG.format(state=state))) as orch:
        session = orch.session("agent:coder:pydantic-ai-example")
        steps = iter(SCRIPT)

        def scripted(messages: list[Any], info: AgentInfo) -> ModelResponse:
            return ModelResponse(parts=next(steps))

        tools = await pydantic_ai_tools(session)
        print("offered:", ", ".join(sorted(t.name for t in tools)))
        run = await Agent(FunctionModel(scripted), tools=tools).run("Write hello.txt, then show it.")
        for message in run.all_messages():
            for part in getattr(message, "parts", []):
                if isinstance(part, ToolReturnPart):
                    print(f"{part.tool_name}: {part.content}")
        print("model:", run.output)
        await session.close()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="sandbox-example-"))
