"""The stages of one tool call, each on its own (engine/call.py, stages.py, running.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest

from sandbox.config.models import Config
from sandbox.engine.call import MAX_TOOL_NAME, Call, Checked, Ran, Refusal, open_call, tool_name
from sandbox.engine.executor import Engine
from sandbox.engine.limits import Limiter
from sandbox.engine.progress import ProgressBus
from sandbox.engine.running import lift_own_spill, run_handler, shape_output
from sandbox.engine.stages import check_governing, check_policy, propose, run_hooks, validate
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.store import Journal
from sandbox.policy.resolver import Identity, PolicyResolver
from sandbox.tools.context import ToolContext
from sandbox.tools.registry import ToolRegistry


@pytest.fixture
def config(make_config: Any, tmp_path: Path) -> Config:
    ws = tmp_path / "ws"
    ws.mkdir()
    return cast(
        Config,
        make_config(
            f"""
tools: {{profile: full}}
limits: {{timeouts: {{min_s: 0.1, max_s: 0.2}}}}
agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}
"""
        ),
    )


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    store = Journal(tmp_path / "journal.sqlite")
    yield store
    store.close()


@pytest.fixture
def engine(config: Config, journal: Journal) -> Engine:
    registry = ToolRegistry()

    @registry.tool(category="custom")
    async def greet(ctx: Any, name: str, times: int = 1) -> str:
        """Greet someone."""
        return " ".join([f"hi {name}"] * times)

    @registry.tool(category="custom")
    async def stall(ctx: Any) -> None:
        """Never finishes."""
        await anyio.sleep_forever()

    return Engine(registry, Limiter(config.limits), ProgressBus(), max_chars=50, journal=journal, max_argument_depth=4)


def new_call(engine: Engine, config: Config, name: object = "greet") -> Call:
    policy = PolicyResolver(config, extra_tools=("greet", "stall")).resolve(Identity("a", "agent:a:main", None, None))
    return open_call(engine, policy, name, tenant="default", sender=None, trace_id=None)


def checked(call: Call, arguments: dict[str, Any]) -> Checked:
    result = validate(call, arguments)
    assert isinstance(result, Checked)
    return result


def test_tool_name_is_normalised_and_an_absurd_one_cut() -> None:
    """Names are trimmed and lower-cased, aliases resolved, and a name past 128 characters cut."""
    assert tool_name("  Greet ") == "greet" and tool_name("apply-patch") == "apply_patch"
    assert tool_name(42) == "int"
    long = tool_name("x" * 500)
    assert long.startswith("x" * MAX_TOOL_NAME) and long.endswith("(+372 chars)")


def test_propose_journals_and_refuses_what_is_too_deep_or_refused(engine: Engine, config: Config) -> None:
    """Too-deep arguments are refused as invalid (journaled only described); a call refused beforehand stops."""
    call = new_call(engine, config)
    deep = propose(call, {"a": {"b": {"c": {"d": {"e": 1}}}}})
    assert deep is not None and deep.stage == "invalid" and deep.error.code == ErrorCode.INVALID_ARGUMENTS
    blocked = SandboxError(ErrorCode.BLOCKED, "its dependency failed")
    assert propose(new_call(engine, config), {}, blocked) == Refusal("blocked", blocked)
    assert propose(new_call(engine, config), {"name": "bob"}) is None


def test_check_policy_hides_a_tool_outside_the_session(engine: Engine, config: Config) -> None:
    """An unknown tool is TOOL_NOT_FOUND, naming the tools the session has; a known one passes."""
    refusal = check_policy(new_call(engine, config, "Nope"))
    assert refusal is not None and refusal.stage == "not_found"
    assert refusal.error.code == ErrorCode.TOOL_NOT_FOUND and "'Nope' does not exist" in refusal.error.message
    assert refusal.error.details["available"] == ["greet", "stall"]
    assert check_policy(new_call(engine, config)) is None


def test_validate_names_each_bad_field(engine: Engine, config: Config) -> None:
    """Bad arguments are INVALID_ARGUMENTS with one entry per field; good ones come back as params."""
    call = new_call(engine, config)
    refusal = validate(call, {"times": "many"})
    assert isinstance(refusal, Refusal) and refusal.stage == "invalid"
    assert {f["field"] for f in refusal.error.details["fields"]} == {"name", "times"}
    assert checked(call, {"name": "bob"}).params == {"name": "bob", "times": 1}


@pytest.mark.anyio
async def test_hooks_block_rewrite_or_break_the_call(engine: Engine, config: Config) -> None:
    """A hook may block (BLOCKED, naming it), rewrite (new params), or rewrite into an invalid call (refused)."""

    async def shout(ctx: Any, tool: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"params": {**params, "name": params["name"].upper()}}

    engine.hooks.add_before(shout)
    call = new_call(engine, config)
    rewritten = await run_hooks(call, checked(call, {"name": "bob"}))
    assert isinstance(rewritten, Checked) and rewritten.params == {"name": "BOB", "times": 1}

    async def breaks(ctx: Any, tool: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"params": {"times": -1.5}}

    engine.hooks.add_before(breaks)
    broken = await run_hooks(call, checked(call, {"name": "bob"}))
    assert isinstance(broken, Refusal) and broken.stage == "invalid"
    assert broken.error.message.startswith("hook breaks rewrote the arguments of greet into an invalid call")

    async def veto(ctx: Any, tool: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"blocked": True, "reason": "not today"}

    engine.hooks.before.insert(0, ("veto", veto))
    blocked = await run_hooks(call, checked(call, {"name": "bob"}))
    assert isinstance(blocked, Refusal) and blocked.error.code == ErrorCode.BLOCKED
    assert blocked.error.message == "not today" and blocked.error.details == {"hook": "veto"}


def test_acting_on_a_running_command_needs_its_governing_tool(engine: Engine, config: Config) -> None:
    """`process write` without exec in the session is PERMISSION_DENIED; with exec it passes."""
    call = new_call(engine, config, "process")
    assert check_governing(call, {"action": "write"}) is None  # profile full: exec is there
    call.policy = dataclasses.replace(call.policy, allowed=frozenset({"process"}))
    refusal = check_governing(call, {"action": "write"})
    assert refusal is not None and refusal.error.code == ErrorCode.PERMISSION_DENIED
    assert check_governing(call, {"action": "poll"}) is None


def test_a_handlers_own_saved_output_moves_to_the_result() -> None:
    """`full_output_path` in a handler's output is lifted out of it (the output itself is not changed)."""
    output = {"stdout": "cut", "full_output_path": "/workspace/.sandbox/outputs/c.txt"}
    lifted, path = lift_own_spill(output)
    assert lifted == {"stdout": "cut"} and path == "/workspace/.sandbox/outputs/c.txt"
    assert "full_output_path" in output
    assert lift_own_spill("text") == ("text", None) and lift_own_spill({"full_output_path": 3})[1] is None


@pytest.mark.anyio
async def test_run_handler_stops_at_the_clamped_timeout(engine: Engine, config: Config) -> None:
    """A handler past the tool's timeout (clamped to limits.timeouts.max_s) ends as TIMEOUT."""
    call = new_call(engine, config, "stall")
    tool_ctx = cast(ToolContext, SimpleNamespace(config=config))
    with pytest.raises(SandboxError) as info:
        await run_handler(call, checked(call, {}), tool_ctx)
    assert info.value.code == ErrorCode.TIMEOUT and "within 0.2s" in info.value.message


@pytest.mark.anyio
async def test_a_lost_copy_of_a_long_output_is_a_warning(engine: Engine, config: Config) -> None:
    """When the full output cannot be saved the call still succeeds, cut, with a warning saying so."""

    async def broken_spill(ctx: ToolContext, text: str) -> str | None:
        raise OSError("disk full")

    call = new_call(engine, config)
    result = await shape_output(call, Ran(cast(ToolContext, None), "x" * 200), broken_spill)
    assert result.ok and result.truncated and result.full_output_path is None
    assert result.warnings == [
        "the full output could not be saved (OSError: disk full); only the cut output is available"
    ]
    assert isinstance(result.output, str) and "truncated" in result.output


def test_a_refusal_is_journaled_at_its_stage(engine: Engine, config: Config, journal: Journal) -> None:
    """Call.refuse records the refusal's stage with its code and returns it as a failed result."""
    call = new_call(engine, config)
    assert propose(call, {}) is None
    result = call.refuse(Refusal("blocked", SandboxError(ErrorCode.BLOCKED, "no")))
    assert result.error is not None and result.error.code == "BLOCKED" and result.call_id == call.task.call_id
    events = journal.events(call_id=call.task.call_id)
    assert [e.stage for e in events] == ["proposed", "blocked"] and events[1].data["code"] == "BLOCKED"
