"""The demo's sub-agent part: spawn, the child's exec in its own sandbox, a message, the cascade."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sandbox.config.models import Config
from sandbox.engine.orchestrator import Orchestrator
from sandbox.tools.display import describe
from sandbox.tools.spec import ToolResult


def _line(echo: Callable[[str], None], tool: str, args: dict[str, Any], result: ToolResult, note: str) -> bool:
    echo(describe(tool, args))
    if result.ok:
        echo(f"     ✓ {note}")
    else:
        assert result.error is not None
        echo(f"     ✗ UNEXPECTED {result.error.code}: {result.error.message}")
    return result.ok


async def subagents_part(
    config: Config, agent_id: str, key: str, echo: Callable[[str], None], report: dict[str, Any]
) -> bool:
    """A parent spawns a child, talks to it, and closes: the child's sandbox goes with it."""
    echo("sub-agents (policies/examples/subagents.yaml has the settings):")
    ok = True
    async with Orchestrator(config) as orch:
        parent = orch.session(key + "-parent", agent=agent_id)
        if "sessions_spawn" not in parent.policy.allowed:
            echo("     (skipped: this policy does not allow sessions_spawn)")
            return True
        note = {"path": "plan.md", "content": "1. count the lines of plan.md\n"}
        ok &= _line(echo, "write", note, await parent.call("write", note), "the parent writes its plan")
        spawn = {"task": "count the lines of the parent's plan", "name": "counter"}
        spawned = await parent.call("sessions_spawn", spawn)
        ok &= _line(echo, "sessions_spawn", spawn, spawned, "a child session, recorded with its lineage")
        if not spawned.ok:
            return False
        child_key = spawned.output["session"]
        echo(f"     │ {child_key}, sees the parent's workspace at {spawned.output['parent_workspace']}")
        child = orch.session(child_key)
        work = {"command": "wc -l < /parent/plan.md; touch /parent/x 2>&1 | tail -1; id -u"}
        ran = await child.call("exec", work)
        ok &= _line(echo, "exec", work, ran, "the child runs in a sandbox of its own")
        if ran.ok:
            for text in ran.output["output"].splitlines():
                echo(f"     │ {text}")
            ok &= "Read-only file system" in ran.output["output"]
        child_box = await child.sandbox_required()
        echo(f"     │ child's container {child_box.spec.name}")
        message = {"session": child_key, "text": "thanks; report back when done"}
        sent = await parent.call("sessions_send", message)
        ok &= _line(echo, "sessions_send", message, sent, "a message into the child's inbox")
        inbox = orch.messages(child_key, tenant=parent.agent.tenant)
        echo(f"     │ the host application reads it for the child's model: {inbox[-1].text!r}")
        history = {"session": child_key}
        seen = await parent.call("sessions_history", history)
        ok &= _line(echo, "sessions_history", history, seen, "the parent reads the child's calls and messages")
        if seen.ok:
            kinds = [i.get("tool") or i["kind"] for i in seen.output["items"]]
            echo(f"     │ {', '.join(kinds)}")
        closed = await parent.close()
        gone = not await orch.backend.exists(child_box.spec.name)
        echo(f"🧹 close        {parent.key}")
        echo(
            f"     {'✓' if gone else '✗ UNEXPECTED'} the cascade closed {len(closed) - 1} child; its container is gone"
        )
        ok &= gone
        late = await child.call("exec", {"command": "true"})
        refused = late.error is not None and late.error.code == "CONFLICT"
        echo(f"     {'✓' if refused else '✗ UNEXPECTED'} the closed child runs nothing more")
        ok &= refused
        report["subagents"] = {"child": child_key, "closed": closed, "container_removed": gone}
    return ok
