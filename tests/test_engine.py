"""The engine path with fake tools registered in Python: validation, limits, retries, batches,
progress and context (host mode: no container needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.engine import context as ctxvars
from sandbox.engine.batch import BatchCall
from sandbox.engine.progress import ProgressBus, ProgressEvent
from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools import BUILTIN_SPECS
from sandbox.tools.handlers import builtin_handlers
from sandbox.tools.registry import ToolRegistry
from sandbox.tools.spec import RetryPolicy

pytestmark = pytest.mark.anyio


def make_registry() -> ToolRegistry:
    handlers = builtin_handlers()
    return ToolRegistry((s, handlers.get(s.name)) for s in BUILTIN_SPECS)


@pytest.fixture
def config(make_config: Any, tmp_path: Path) -> Any:
    ws = tmp_path / "ws"
    ws.mkdir()
    return make_config(
        f"""
tools: {{profile: full}}
limits: {{global_concurrency: 10, categories: {{exec: 2, custom: 3}}, queue: {{max_depth: 100, max_wait_s: 5}}}}
agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}
"""
    )


async def test_python_tool_validation_and_context(config: Any) -> None:
    """A decorated tool is callable; bad arguments name each field; the TaskContext is visible."""
    reg = make_registry()
    seen: list[ctxvars.TaskContext | None] = []

    @reg.tool(category="custom")
    async def greet(ctx: Any, name: str, times: int = 1) -> str:
        """Greet someone."""
        seen.append(ctxvars.current.get())
        return " ".join([f"hi {name}"] * times)

    async with Orchestrator(config, registry=reg) as orch:
        sess = orch.session("agent:a:main")
        assert "greet" in [t.name for t in sess.tools()]
        ok = await sess.call("greet", {"name": "bob", "times": 2})
        assert ok.output == "hi bob hi bob"
        assert seen[0] is not None and seen[0].call_id == ok.call_id and seen[0].tool == "greet"
        bad = await sess.call("greet", {"times": "many", "extra": 1})
        assert bad.error.code == "INVALID_ARGUMENTS"
        fields = {f["field"]: f["reason"] for f in bad.error.details["fields"]}
        assert fields == {
            "name": "is required",
            "times": "input should be a valid integer, unable to parse string as an integer",
            "extra": "is not a known field",
        }
        missing = await sess.call("nope", {})
        assert missing.error.code == "TOOL_NOT_FOUND" and "greet" in missing.error.details["available"]


async def test_category_limit_and_queue_full(config: Any) -> None:
    """Calls over a category limit wait FIFO; too many waiting get QUEUE_FULL at once."""
    reg = make_registry()
    running = 0
    peak = 0
    release = anyio.Event()

    @reg.tool(category="custom")
    async def slow(ctx: Any) -> None:
        """Runs until released."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    async with Orchestrator(config, registry=reg) as orch:
        sess = orch.session("agent:a:main")
        results: list[Any] = []

        async def one() -> None:
            results.append(await sess.call("slow", {}))

        async with anyio.create_task_group() as tg:
            for _ in range(30):
                tg.start_soon(one)
            await wait_until(lambda: running == 3)  # the category limit, reached
            release.set()
        assert peak == 3 and len(results) == 30 and all(r.ok for r in results)
    small = config.model_copy(
        update={
            "limits": config.limits.model_copy(
                update={"queue": config.limits.queue.model_copy(update={"max_depth": 5})}
            )
        }
    )
    release = anyio.Event()
    async with Orchestrator(small, registry=reg) as orch:
        sess = orch.session("agent:a:main")
        results = []
        async with anyio.create_task_group() as tg:
            for _ in range(30):
                tg.start_soon(one)
            await wait_until(lambda: len(results) == 22)  # refused at once while 3 run and 5 wait
            release.set()
        codes = [r.error.code if r.error else "ok" for r in results]
        assert codes.count("ok") == 8 and codes.count("QUEUE_FULL") == 22  # 3 running + 5 waiting


async def test_retry_then_exhausted(config: Any) -> None:
    """Retryable failures are retried with backoff; exhaustion carries the last error."""
    reg = make_registry()
    attempts: list[int] = []

    @reg.tool(category="custom", retry=RetryPolicy(max_attempts=3, base_s=0.001, cap_s=0.002))
    async def flaky(ctx: Any, fail_times: int) -> str:
        """Fails a few times."""
        attempts.append(1)
        if len(attempts) <= fail_times:
            raise SandboxError(ErrorCode.NETWORK_ERROR, "connection reset")
        return "done"

    async with Orchestrator(config, registry=reg) as orch:
        sess = orch.session("agent:a:main")
        assert (await sess.call("flaky", {"fail_times": 2})).output == "done"
        attempts.clear()
        exhausted = await sess.call("flaky", {"fail_times": 10})
        assert exhausted.error.code == "RETRY_EXHAUSTED" and len(attempts) == 3
        assert exhausted.error.details["last_error"]["code"] == "NETWORK_ERROR"
        attempts.clear()
        denied = await sess.call("exec", {"command": "exit 0"})
        assert denied.ok


async def test_batches(config: Any) -> None:
    """Parallel batches with dependencies, sequential batches passing results, cycles refused."""
    async with Orchestrator(config, registry=make_registry()) as orch:
        sess = orch.session("agent:a:main")
        result = await sess.call_many(
            [
                BatchCall("write", {"path": "x.txt", "content": "1"}, id="w"),
                BatchCall("read", {"path": "x.txt"}, id="r", depends_on=("w",)),
                BatchCall("read", {"path": "missing.txt"}, id="bad"),
                BatchCall("exec", {"command": "true"}, id="after-bad", depends_on=("bad",)),
            ]
        )
        assert result.status == "PARTIAL_SUCCESS" and result.failed == ["bad", "after-bad"]
        assert result.results[1].output["content"] == "1"
        assert result.results[3].error.code == "BLOCKED"
        seq = await sess.call_many(
            [
                BatchCall("exec", {"command": "echo hello"}, id="e"),
                BatchCall("write", lambda done: {"path": "y.txt", "content": done["e"].output["output"]}, id="w"),
            ],
            mode="sequential",
        )
        assert seq.status == "SUCCESS" and seq.results[1].output["bytes_written"] == 6
        with pytest.raises(SandboxError, match="dependency cycle among: a, b"):
            await sess.call_many(
                [BatchCall("read", {}, id="a", depends_on=("b",)), BatchCall("read", {}, id="b", depends_on=("a",))]
            )


async def test_progress_events(config: Any) -> None:
    """A call emits queued, started, running (heartbeats) and finished to subscribers; exec streams its output."""
    bus = ProgressBus(heartbeat_s=0.01)
    events: list[ProgressEvent] = []
    two_heartbeats = anyio.Event()

    def record(event: ProgressEvent) -> None:
        events.append(event)
        if sum(e.kind == "running" for e in events) >= 2:
            two_heartbeats.set()

    def broken(event: ProgressEvent) -> None:
        raise RuntimeError(event.kind)

    bus.subscribe(record)
    bus.subscribe(broken)  # a broken subscriber does not break the call
    reg = make_registry()

    @reg.tool(category="custom")
    async def patient(ctx: Any) -> str:
        """Returns once two heartbeats went out."""
        with anyio.fail_after(5):
            await two_heartbeats.wait()
        return "done"

    async with Orchestrator(config, registry=reg, progress=bus) as orch:
        sess = orch.session("agent:a:main")
        r = await sess.call("patient", {})
        echoed = await sess.call("exec", {"command": "echo one; echo two"})
    assert r.ok and echoed.ok
    kinds = [e.kind for e in events if e.call_id == r.call_id]
    assert kinds[0] == "queued" and kinds[1] == "started" and kinds[-1] == "finished"
    assert kinds.count("running") >= 2 and set(kinds[2:-1]) == {"running"}
    chunks = "".join(e.detail["chunk"] for e in events if e.kind == "output")
    assert chunks == "one\ntwo\n" and {e.call_id for e in events} == {r.call_id, echoed.call_id}


async def test_a_cancelled_call_ends_its_progress_with_finished(config: Any) -> None:
    """A call whose caller went away says so to its watchers: `finished`, not ok, cancelled (a
    stream watching it, or the relay holding a word of its output, would otherwise wait for good)."""
    bus = ProgressBus()
    events: list[ProgressEvent] = []
    bus.subscribe(events.append)
    reg = make_registry()
    started = anyio.Event()

    @reg.tool(category="custom")
    async def forever(ctx: Any) -> str:
        """Never returns by itself."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    async with Orchestrator(config, registry=reg, progress=bus) as orch:
        sess = orch.session("agent:a:main")
        async with anyio.create_task_group() as tg:
            tg.start_soon(sess.call, "forever", {})
            await started.wait()
            tg.cancel_scope.cancel()
    last = events[-1]
    assert (last.kind, last.detail) == ("finished", {"ok": False, "cancelled": True})
    assert [e.kind for e in events if e.call_id == last.call_id][:2] == ["queued", "started"]


async def test_a_call_that_crashes_after_its_handler_ends_its_progress_with_finished(config: Any) -> None:
    """An after hook that raises (or a journal that cannot be written) fails the call: its watchers
    get `finished` too, with the call's error code."""
    from sandbox.engine.hooks import Hooks

    hooks = Hooks()

    async def broken(ctx: Any, tool: str, params: dict[str, Any], result: Any) -> Any:
        raise RuntimeError("a hook's bug")

    hooks.add_after(broken)
    bus = ProgressBus()
    events: list[ProgressEvent] = []
    bus.subscribe(events.append)
    reg = make_registry()

    @reg.tool(category="custom")
    async def quick(ctx: Any) -> str:
        """Returns at once."""
        return "done"

    async with Orchestrator(config, registry=reg, progress=bus, hooks=hooks) as orch:
        r = await orch.session("agent:a:main").call("quick", {})
    assert not r.ok and r.error is not None
    last = [e for e in events if e.call_id == r.call_id][-1]
    assert (last.kind, last.detail) == ("finished", {"ok": False, "code": r.error.code})


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_timeouts_clamped_and_logs_carry_context(config: Any) -> None:
    """A tool's timeout is clamped to limits.timeouts; every log line carries the call context."""
    from loguru import logger

    from sandbox.engine.running import tool_timeout

    clamped = config.model_copy(
        update={
            "limits": config.limits.model_copy(
                update={
                    "timeouts": config.limits.timeouts.model_copy(
                        update={"min_s": 0.1, "max_s": 0.3, "tools": {"slowpoke": 100}}
                    )
                }
            )
        }
    )
    assert tool_timeout(clamped, "slowpoke", 5) == 0.3 and tool_timeout(clamped, "other", 0.01) == 0.1
    reg = make_registry()

    @reg.tool(category="custom", timeout_s=50, retry=RetryPolicy(max_attempts=1))  # one timeout is enough here
    async def slowpoke(ctx: Any) -> None:
        """Sleeps."""
        logger.info("handler_says_hi")
        await anyio.sleep_forever()

    lines: list[dict[str, Any]] = []
    logger.enable("sandbox")
    sink = logger.add(lambda m: lines.append({"msg": m.record["message"], **m.record["extra"]}), level="INFO")
    try:
        async with Orchestrator(clamped, registry=reg) as orch:
            result = await orch.session("agent:a:main").call("slowpoke", {})
    finally:
        logger.remove(sink)
        logger.disable("sandbox")
    assert result.error.code in ("TIMEOUT", "RETRY_EXHAUSTED")
    hi = next(line for line in lines if line["msg"] == "handler_says_hi")
    assert hi["call_id"] == result.call_id and hi["tool"] == "slowpoke" and hi["agent"] == "a"
    assert any(line["msg"] == "tool_call_failed" and line["call_id"] == result.call_id for line in lines)


async def wait_until(condition: Callable[[], bool], deadline_s: float = 5.0) -> None:
    """Poll a condition with a deadline (no timing assumptions)."""
    with anyio.fail_after(deadline_s):
        while not condition():
            await anyio.sleep(0.001)
