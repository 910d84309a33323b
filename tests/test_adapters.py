"""The agent-framework adapters end to end, each with a scripted model (no network): the
framework sees exactly the session's policy-filtered tools, a write then a read go through the
session (policy, journal, the workspace), and a failure comes back the framework's way. The
session runs in host mode here (no containers): what is tested is the adapter's mapping; the
tools themselves are tested against the engine elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator, load_config_text
from tests.conftest import ROOT

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # the frameworks take seconds to import


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[Any]:
    ws = tmp_path / "ws"
    ws.mkdir()
    config = load_config_text(f"""
state_dir: {tmp_path / "state"}
tools: {{profile: coding, deny: [exec, process]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list: [{{id: main, workspace: "{ws}"}}]
""")
    async with Orchestrator(config) as orch:
        yield orch.session("agent:main:adapters")


def _offered(session: Any) -> set[str]:
    return {s["name"] for s in session.tool_schemas()}


async def test_langchain_tools_run_through_the_session(session: Any) -> None:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from sandbox.adapters.langchain import langchain_tools

    tools = {t.name: t for t in await langchain_tools(session)}
    assert set(tools) == _offered(session) and "exec" not in tools  # the policy's tools, exactly
    script = iter(
        [
            AIMessage("", tool_calls=[{"name": "write", "args": {"path": "a.txt", "content": "hi"}, "id": "c1"}]),
            AIMessage("", tool_calls=[{"name": "read", "args": {"path": "a.txt"}, "id": "c2"}]),
            AIMessage("", tool_calls=[{"name": "read", "args": {"path": "missing.txt"}, "id": "c3"}]),
            AIMessage("done"),
        ]
    )
    model = GenericFakeChatModel(messages=script)
    messages: list[Any] = [HumanMessage("write a file, read it back")]
    while True:  # the agent loop: the model's tool calls run, their messages go back to it
        answer = await model.ainvoke(messages)
        messages.append(answer)
        if not answer.tool_calls:
            break
        for call in answer.tool_calls:
            messages.append(await tools[call["name"]].ainvoke(call))
    replies = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.status for m in replies] == ["success", "success", "error"]
    assert json.loads(str(replies[1].content))["content"] == "hi"
    assert replies[2].content.startswith("FILE_NOT_FOUND:")


async def test_pydantic_ai_agent_runs_the_sessions_tools(session: Any) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from sandbox.adapters.pydantic_ai import pydantic_ai_tools

    seen: list[set[str]] = []
    steps: Iterator[list[Any]] = iter(
        [
            [ToolCallPart("write", {"path": "b.txt", "content": "from pydantic-ai"}, tool_call_id="p1")],
            [ToolCallPart("read", {"path": "b.txt"}, tool_call_id="p2")],
            [ToolCallPart("read", {"path": "nope.txt"}, tool_call_id="p3")],
            [TextPart("done")],
        ]
    )

    def scripted(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.append({t.name for t in info.function_tools})
        return ModelResponse(parts=next(steps))

    agent = Agent(FunctionModel(scripted), tools=await pydantic_ai_tools(session))
    run = await agent.run("write a file, read it back")
    assert run.output == "done"
    assert seen[0] == _offered(session) and "exec" not in seen[0]
    returns = [p for m in run.all_messages() for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
    assert json.loads(str(returns[1].content))["content"] == "from pydantic-ai"
    assert returns[2].content.startswith("FILE_NOT_FOUND:")
    assert (Path(session.agent.workspace) / "b.txt").read_text() == "from pydantic-ai"


async def test_openai_agents_runner_runs_the_sessions_tools(session: Any) -> None:
    from agents import Agent, RunConfig, Runner

    from sandbox.adapters.openai_agents import openai_agents_tools
    from sandbox.adapters.scripted import ScriptedModel

    model = ScriptedModel(
        [
            ("write", {"path": "c.txt", "content": "from the agents sdk"}),
            ("read", {"path": "c.txt"}),
            ("read", {"path": "gone.txt"}),
        ]
    )
    agent = Agent(name="coder", instructions="be brief", tools=await openai_agents_tools(session), model=model)
    # no trace leaves this machine (the SDK would export them to OpenAI with a key set)
    result = await Runner.run(agent, "write a file, read it back", run_config=RunConfig(tracing_disabled=True))
    assert result.final_output == "done"
    assert model.offered[0] == _offered(session) and "exec" not in model.offered[0]
    outputs = model.tool_outputs
    assert json.loads(outputs[1])["content"] == "from the agents sdk"
    assert outputs[2].startswith("error: FILE_NOT_FOUND:")


@pytest.fixture
async def approving(tmp_path: Path) -> AsyncIterator[Any]:
    """A session whose `write` waits for a human (tools.approvals), `read` does not."""
    ws = tmp_path / "ws"
    ws.mkdir()
    config = load_config_text(f"""
state_dir: {tmp_path / "state"}
tools: {{profile: coding, deny: [exec, process], approvals: {{require: [write], timeout_s: 5}}}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list: [{{id: main, workspace: "{ws}"}}]
""")
    async with Orchestrator(config) as orch:
        yield orch.session("agent:main:approvals")


def _approved_stages(session: Any) -> list[str]:
    """The reasons of the session's `approved` stages, and whether any call waited."""
    journal = session._orch.journal
    events = journal.events(session=session.key)
    assert not [e for e in events if e.stage == "awaiting_approval"]  # nothing ever waited in the service
    return [str(e.data.get("reason", "")) for e in events if e.stage == "approved"]


async def test_pydantic_ai_pauses_for_approval_its_own_way(approving: Any) -> None:
    """With approvals="framework", a write (which needs approval) ends the run with PydanticAI's
    DeferredToolRequests and nothing is written; resumed with the human's "yes", it runs,
    journaled approved by the caller; with "no", it is never sent. A read does not pause."""
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from sandbox.adapters.pydantic_ai import pydantic_ai_tools

    workspace = Path(approving.agent.workspace)
    steps: Iterator[list[Any]] = iter(
        [
            [ToolCallPart("read", {"path": "none.txt"}, tool_call_id="r1")],
            [ToolCallPart("write", {"path": "yes.txt", "content": "approved"}, tool_call_id="w1")],
            [ToolCallPart("write", {"path": "no.txt", "content": "denied"}, tool_call_id="w2")],
            [TextPart("done")],
        ]
    )

    def scripted(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=next(steps))

    tools = await pydantic_ai_tools(approving, approvals="framework")
    agent = Agent(FunctionModel(scripted), tools=tools, output_type=[str, DeferredToolRequests])
    first = await agent.run("write two files")
    assert isinstance(first.output, DeferredToolRequests)
    assert [(c.tool_name, c.tool_call_id) for c in first.output.approvals] == [("write", "w1")]
    assert not (workspace / "yes.txt").exists() and _approved_stages(approving) == []
    second = await agent.run(
        message_history=first.all_messages(), deferred_tool_results=DeferredToolResults(approvals={"w1": True})
    )
    assert (workspace / "yes.txt").read_text() == "approved"
    assert isinstance(second.output, DeferredToolRequests) and second.output.approvals[0].tool_call_id == "w2"
    third = await agent.run(
        message_history=second.all_messages(), deferred_tool_results=DeferredToolResults(approvals={"w2": False})
    )
    assert third.output == "done" and not (workspace / "no.txt").exists()
    reasons = _approved_stages(approving)
    assert len(reasons) == 1 and reasons[0].startswith("approved by the caller before the call: approved in PydanticAI")
    # the default leaves approvals to the service: a write would wait there (here: for 5 s, then time out)
    assert approving.approval_required("write", {"path": "x"}) and not approving.approval_required("read", {})


async def test_openai_agents_pause_for_approval_their_own_way(approving: Any) -> None:
    """With approvals="framework", the SDK's needs_approval interrupts the run before a write;
    once the application approves the interruption and runs on, the write runs, journaled
    approved by the caller; a rejected one is never sent."""
    from agents import Agent, RunConfig, Runner

    from sandbox.adapters.openai_agents import openai_agents_tools
    from sandbox.adapters.scripted import ScriptedModel

    workspace = Path(approving.agent.workspace)
    model = ScriptedModel(
        [("write", {"path": "sdk-yes.txt", "content": "approved"}), ("write", {"path": "sdk-no.txt", "content": "x"})]
    )
    tools = await openai_agents_tools(approving, approvals="framework")
    agent = Agent(name="coder", instructions="be brief", tools=tools, model=model)
    config = RunConfig(tracing_disabled=True)
    first = await Runner.run(agent, "write two files", run_config=config)
    assert [i.raw_item.name for i in first.interruptions] == ["write"]
    assert not (workspace / "sdk-yes.txt").exists() and _approved_stages(approving) == []
    state = first.to_state()
    state.approve(first.interruptions[0])
    second = await Runner.run(agent, state, run_config=config)
    assert (workspace / "sdk-yes.txt").read_text() == "approved"
    assert [i.raw_item.name for i in second.interruptions] == ["write"]
    state = second.to_state()
    state.reject(second.interruptions[0])
    third = await Runner.run(agent, state, run_config=config)
    assert third.final_output == "done" and not (workspace / "sdk-no.txt").exists()
    reasons = _approved_stages(approving)
    assert len(reasons) == 1 and "approved in the OpenAI Agents SDK" in reasons[0]


@pytest.mark.docker
@pytest.mark.usefixtures("images")
@pytest.mark.parametrize("example", ["langchain_agent.py", "pydantic_ai_agent.py", "openai_agents_agent.py"])
def test_each_example_runs(example: str, tmp_path: Path) -> None:
    """examples/ run offline with their scripted model, in a real sandbox (a real model is one
    line away); the session is closed at the end, so its container goes."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example), str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hello from the sandbox" in done.stdout, done.stdout
