"""Hooks, approvals, loop detection and the journal on the call path (host mode: no container)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.engine.hooks import HookDecision, Hooks
from tests.cli_helpers import run_cli

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def host(make_config: Any, ws: Path, extra: str = "") -> Any:
    return make_config(
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}\n{extra}"
    )


async def test_hooks_block_rewrite_and_invalid_rewrite(make_config: Any, ws: Path) -> None:
    """A hook blocks (BLOCKED, nothing runs), rewrites (validated again), and an invalid rewrite is refused."""
    hooks = Hooks()

    async def guard(ctx: Any, tool: str, params: dict[str, Any]) -> Any:
        if tool == "exec" and "rm -rf" in params["command"]:
            return {"blocked": True, "reason": "destructive command"}
        if tool == "write" and params["path"].endswith(".tmp"):
            return HookDecision(params={**params, "path": params["path"][:-4] + ".txt"})
        if tool == "write" and params["path"] == "break.me":
            return HookDecision(params={"path": 42})
        return None

    hooks.add_before(guard)
    async with Orchestrator(host(make_config, ws), hooks=hooks) as orch:
        sess = orch.session("agent:a:main")
        blocked = await sess.call("exec", {"command": "touch ran; rm -rf /tmp/x"})
        assert blocked.error.code == "BLOCKED" and blocked.error.message == "destructive command"
        assert not (ws / "ran").exists()
        moved = await sess.call("write", {"path": "note.tmp", "content": "x"})
        assert moved.ok and moved.output["path"].endswith("note.txt") and (ws / "note.txt").exists()
        assert hooks.rewrites[-1]["after"]["path"] == "note.txt"
        broken = await sess.call("write", {"path": "break.me", "content": "x"})
        assert broken.error.code == "INVALID_ARGUMENTS" and "hook guard rewrote the arguments" in broken.error.message


async def test_after_hook_redacts_result(make_config: Any, ws: Path) -> None:
    """An after_tool_call hook sees the result and may replace it."""
    hooks = Hooks()

    async def scrub(ctx: Any, tool: str, params: dict[str, Any], result: Any) -> Any:
        if result.ok and isinstance(result.output, dict) and "output" in result.output:
            return result.model_copy(
                update={"output": {**result.output, "output": result.output["output"].replace("hunter2", "[redacted]")}}
            )
        return None

    hooks.add_after(scrub)
    async with Orchestrator(host(make_config, ws), hooks=hooks) as orch:
        r = await orch.session("agent:a:main").call("exec", {"command": "echo password=hunter2"})
    assert r.output["output"] == "password=[redacted]\n"


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_approval_approve_deny_timeout(make_config: Any, ws: Path) -> None:
    """A call needing approval waits; approve runs it, deny returns the reason, silence times out."""
    config = host(make_config, ws, "tools: {approvals: {require: [exec], timeout_s: 0.4}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")

        async def decide(verdict: str) -> None:
            while not orch.pending_approvals():
                await anyio.sleep(0.02)
            pending = orch.pending_approvals()[0]
            assert pending.tool == "exec" and pending.arguments["command"].startswith("echo")
            (orch.approve if verdict == "approve" else orch.deny)(pending.id, "not today" if verdict == "deny" else "")

        results: list[Any] = []
        for verdict in ("approve", "deny"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(decide, verdict)
                results.append(await sess.call("exec", {"command": f"echo {verdict}d > {verdict}.txt"}))
        assert results[0].ok and (ws / "approve.txt").exists()
        assert results[1].error.code == "APPROVAL_DENIED" and "not today" in results[1].error.message
        assert not (ws / "deny.txt").exists()
        timed = await sess.call("exec", {"command": "echo late > late.txt"})
        assert timed.error.code == "APPROVAL_TIMEOUT" and not (ws / "late.txt").exists()
        assert (await sess.call("read", {"path": "approve.txt"})).ok  # read needs no approval
        stages = [e.stage for e in orch.journal.events(call_id=results[0].call_id)]
        assert stages == [
            "proposed",
            "policy_checked",
            "validated",
            "awaiting_approval",
            "approved",
            "queued",
            "running",
            "finished",
        ]


async def test_waiting_for_approval_holds_no_permit(make_config: Any, ws: Path) -> None:
    """With one global permit, a call suspended for approval does not stop another call."""
    config = host(
        make_config,
        ws,
        "limits: {global_concurrency: 1, tenant_concurrency: 1}\ntools: {approvals: {require: [write], timeout_s: 5}}",
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")
        other: list[Any] = []

        async def waiting() -> None:
            other.append(await sess.call("write", {"path": "w.txt", "content": "1"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting)
            while not orch.pending_approvals():
                await anyio.sleep(0.02)
            with anyio.fail_after(3):
                r = await sess.call("exec", {"command": "echo meanwhile"})
            assert r.ok and orch.limiter.in_use(("global",)) == 0
            orch.approve(orch.pending_approvals()[0].id)
        assert other[0].ok


async def test_loop_patterns_trip_at_their_thresholds(make_config: Any, ws: Path) -> None:
    """genericRepeat, knownPollNoProgress and pingPong warn, block, then trip the breaker; not before."""
    config = host(
        make_config,
        ws,
        "tools: {loop_detection: {enabled: true, window: 20, warn_threshold: 3, critical_threshold: 5, global_circuit_breaker: 7}}",
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")
        seen = []
        for _ in range(7):
            r = await sess.call("exec", {"command": "echo same"})
            seen.append("warn" if r.ok and r.warnings else "ok" if r.ok else r.error.code)
        assert seen == ["ok", "ok", "warn", "warn", "BLOCKED", "BLOCKED", "BLOCKED"]
        assert "genericRepeat" in r.error.message or "circuit breaker" in r.error.message
        tripped = await sess.call("read", {"path": "anything"})
        assert tripped.error.code == "BLOCKED" and "circuit breaker" in tripped.error.message
        await sess.reset_loops()
        assert (await sess.call("exec", {"command": "echo fresh"})).ok

        poll = orch.session("agent:a:poll")
        start = await poll.call("exec", {"command": "sleep 30", "background": True})
        pid = start.output["process_id"]
        seen = []
        for _ in range(5):
            r = await poll.call("process", {"action": "poll", "id": pid})
            seen.append("warn" if r.ok and r.warnings else "ok" if r.ok else r.error.code)
        assert seen == ["ok", "ok", "warn", "warn", "BLOCKED"] and "knownPollNoProgress" in r.error.message
        await poll.reset_loops()
        assert (await poll.call("process", {"action": "kill", "id": pid})).ok

        pp = orch.session("agent:a:pingpong")
        await pp.call("write", {"path": "p.txt", "content": "x"})
        seen, blocked = [], []
        for i in range(5):
            args = {"path": "p.txt"} if i % 2 == 0 else {"path": "p.txt", "line_numbers": True}
            r = await pp.call("read", args)
            seen.append("warn" if r.ok and r.warnings else "ok" if r.ok else r.error.code)
            if r.error:
                blocked.append(r.error.message)
        assert seen == ["ok", "ok", "warn", "warn", "BLOCKED"], seen
        assert "pingPong" in blocked[0]


@pytest.mark.slow
async def test_loop_detection_off_by_default(make_config: Any, ws: Path) -> None:
    """Without tools.loop_detection.enabled nothing is ever flagged."""
    async with Orchestrator(host(make_config, ws)) as orch:
        sess = orch.session("agent:a:main")
        results = [await sess.call("exec", {"command": "true"}) for _ in range(25)]
    assert all(r.ok and not r.warnings for r in results)


async def test_journal_timeline_and_redaction(make_config: Any, ws: Path) -> None:
    """Every stage is journaled with trace and call ids; secrets are masked in arguments and results."""
    async with Orchestrator(host(make_config, ws)) as orch:
        sess = orch.session("agent:a:main")
        r = await sess.call(
            "exec",
            {"command": "echo token=ghp_abcdefghijklmnopqrstuvwx12345", "env": {"API_KEY": "s3cret"}},
            trace_id="t-fixed",
        )
        missing = await sess.call("nope", {})
        events = orch.journal.events(trace_id="t-fixed")
    assert [e.stage for e in events] == ["proposed", "policy_checked", "validated", "queued", "running", "finished"]
    assert {e.call_id for e in events} == {r.call_id} and all(e.session == "agent:a:main" for e in events)
    dumped = json.dumps([e.data for e in events])
    assert "s3cret" not in dumped and "ghp_abc" not in dumped and "***" in dumped
    assert missing.error.code == "TOOL_NOT_FOUND"


async def test_unwritable_journal_fails_the_call_loudly(make_config: Any, ws: Path, tmp_path: Path) -> None:
    """With a read-only state dir the orchestrator (or the call) fails; nothing runs unrecorded."""
    state = tmp_path / "ro-state"
    state.mkdir()
    config = host(make_config, ws).model_copy(update={"state_dir": state})
    async with Orchestrator(config) as orch:
        os.chmod(state, stat.S_IRUSR | stat.S_IXUSR)
        (state / "journal.sqlite3").chmod(0o400)
        for side in state.glob("journal.sqlite3-*"):
            side.chmod(0o400)
        try:
            if os.geteuid() == 0:
                # root ignores file modes: simulate the failing disk at the database itself
                orch.journal._db.close()
            r = await orch.session("agent:a:main").call("exec", {"command": "touch ran"})
        finally:
            os.chmod(state, 0o755)
    assert not r.ok and r.error.code == "INTERNAL" and "journal" in r.error.message
    assert not (ws / "ran").exists()


def test_logs_cli_reconstructs_a_trace(tmp_path: Path, instance: str) -> None:
    """`sandbox logs --trace` prints the call's timeline; `approvals list` reads the same journal."""
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\nagents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}\n"
    )
    run = run_cli("call", "--session", "agent:a:main", "exec", '{"command": "true"}', config=cfg, timeout=60)
    trace = json.loads(run.stdout)["trace_id"]
    logs = run_cli("logs", "--trace", trace, config=cfg, timeout=60)
    stages = [line.split()[4] for line in logs.stdout.splitlines()]
    assert stages == ["proposed", "policy_checked", "validated", "queued", "running", "finished"]
    listed = run_cli("approvals", "list", config=cfg, timeout=60)
    assert listed.stdout.strip() == "no pending approvals"
