"""`sandbox mcp` driven by the official MCP client over stdio: tools/list is the policy-filtered
list, tools/call runs through the engine (mode off here: no containers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.anyio


@pytest.mark.slow
async def test_list_and_call_over_stdio(tmp_path: Path) -> None:
    """The client sees exactly the session's tools and gets ToolResults, errors flagged isError."""
    from mcp.client.session import ClientSession  # heavy: imported by the test, not at collection
    from mcp.client.stdio import StdioServerParameters, stdio_client

    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "hello.txt").write_text("hi from the workspace\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path / 'state'}\ntools: {{profile: coding, deny: [exec]}}\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{tmp_path / 'ws'}'}}]}}\n"
    )
    params = StdioServerParameters(  # this run's environment (its bytecode cache), not mcp's bare default
        command=sys.executable,
        args=["-m", "sandbox", "--config", str(cfg), "mcp", "--agent", "a"],
        env=dict(os.environ),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        listed = await client.list_tools()
        names = {t.name for t in listed.tools}
        assert "read" in names and "exec" not in names  # denied by the config
        ok = await client.call_tool("read", {"path": "hello.txt"})
        body = json.loads(ok.content[0].text)
        assert not ok.is_error and body["ok"] and "hi from the workspace" in body["output"]["content"]
        refused = await client.call_tool("exec", {"command": "id"})
        assert refused.is_error and json.loads(refused.content[0].text)["error"]["code"] == "TOOL_NOT_FOUND"


@pytest.mark.slow
async def test_a_tools_call_with_an_idempotency_key_in_meta_runs_once(tmp_path: Path) -> None:
    """`_meta: {"agent-sandbox.io/idempotency-key": K}` on tools/call: a repeat gets the first result."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    (tmp_path / "ws").mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path / 'state'}\ntools: {{profile: coding}}\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{tmp_path / 'ws'}'}}]}}\n"
    )
    params = StdioServerParameters(  # this run's environment (its bytecode cache), not mcp's bare default
        command=sys.executable,
        args=["-m", "sandbox", "--config", str(cfg), "mcp", "--agent", "a"],
        env=dict(os.environ),
    )
    command = {"command": "echo ran >> count.txt; wc -l < count.txt"}
    from mcp.types import RequestParamsMeta

    meta: RequestParamsMeta = {"agent-sandbox.io/idempotency-key": "mcp-1"}  # type: ignore[typeddict-unknown-key]
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        bodies = [json.loads((await client.call_tool("exec", command, meta=meta)).content[0].text) for _ in range(2)]
        fresh = json.loads((await client.call_tool("exec", command)).content[0].text)
    assert [b["output"]["output"].strip() for b in bodies] == ["1", "1"] and bodies[0]["call_id"] == bodies[1][
        "call_id"
    ]
    assert fresh["output"]["output"].strip() == "2"
