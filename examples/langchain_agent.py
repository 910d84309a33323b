"""LangChain tools from an agent-sandbox session: the model is offered exactly the tools the
session's policy allows, and every call runs in the session's hardened container.

Run: python examples/langchain_agent.py [STATE_DIR]   (needs the engine and `sandbox images build`)

A scripted model plays the LLM so this runs offline. With a real one, bind the same tools:
`ChatOpenAI(model=...).bind_tools(tools)` (or any chat model with tool calling).
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import anyio
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from sandbox import Orchestrator, load_config_text
from sandbox.adapters.langchain import langchain_tools

CONFIG = """
state_dir: {state}
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: rw}}}}
  list: [{{id: coder}}]
"""


async def main(state: str) -> None:
    async with Orchestrator(load_config_text(CONFIG.format(state=state))) as orch:
        session = orch.session("agent:coder:langchain-example")
        tools = {tool.name: tool for tool in await langchain_tools(session)}
        print("offered:", ", ".join(sorted(tools)))
        write = {"name": "write", "id": "1", "args": {"path": "hello.txt", "content": "hello from the sandbox"}}
        show = {"name": "exec", "id": "2", "args": {"command": "cat hello.txt; id -u"}}
        done = AIMessage("The file says hello.")
        script = [AIMessage("", tool_calls=[write]), AIMessage("", tool_calls=[show]), done]
        model = GenericFakeChatModel(messages=iter(script))
        messages: list[Any] = [HumanMessage("Write hello.txt, then show it.")]
        while True:
            answer = await model.ainvoke(messages)
            messages.append(answer)
            if not answer.tool_calls:
                print("model:", answer.content)
                break
            for call in answer.tool_calls:
                reply = await tools[call["name"]].ainvoke(call)
                print(f"{call['name']}: {reply.content}")
                messages.append(reply)
        await session.close()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="sandbox-example-"))
