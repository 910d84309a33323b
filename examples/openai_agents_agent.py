"""An OpenAI Agents SDK agent whose tools are an agent-sandbox session's: exactly what the
session's policy allows, each call run in the session's hardened container.

Run: python examples/openai_agents_agent.py [STATE_DIR]   (needs the engine and `sandbox images build`)

A scripted model (sandbox.adapters.scripted) plays the LLM so this runs offline. With a real
one, leave `model=` out (the SDK's default, with OPENAI_API_KEY) or name one: `model="gpt-4.1"`.
"""

from __future__ import annotations

import sys
import tempfile

import anyio
from agents import Agent, RunConfig, Runner

from sandbox import Orchestrator, load_config_text
from sandbox.adapters.openai_agents import openai_agents_tools
from sandbox.adapters.scripted import ScriptedModel

CONFIG = """
state_dir: {state}
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: rw}}}}
  list: [{{id: coder}}]
"""


async def main(state: str) -> None:
    async with Orchestrator(load_config_text(CONFIG.format(state=state))) as orch:
        session = orch.session("agent:coder:openai-agents-example")
        tools = await openai_agents_tools(session)
        print("offered:", ", ".join(sorted(t.name for t in tools)))
        model = ScriptedModel(
            [
                ("write", {"path": "hello.txt", "content": "hello from the sandbox"}),
                ("exec", {"command": "cat hello.txt; id -u"}),
            ],
            final="The file says hello.",
        )
        agent = Agent(name="coder", instructions="Use the tools.", tools=tools, model=model)
        # the scripted run sends nothing anywhere: no trace export either
        result = await Runner.run(agent, "Write hello.txt, then show it.", run_config=RunConfig(tracing_disabled=True))
        for output in model.tool_outputs:
            print("tool:", output)
        print("model:", result.final_output)
        await session.close()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="sandbox-example-"))
