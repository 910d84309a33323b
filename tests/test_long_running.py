"""A service that runs for weeks: per-session state is bounded and goes when a session closes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from sandbox import Orchestrator
from sandbox.engine.loops import MemoryLoopStore
from sandbox.policy.resolver import Identity, PolicyResolver
from sandbox.runtime import manager as manager_module
from sandbox.runtime.manager import SandboxManager
from sandbox.runtime.spec import SandboxSpec
from sandbox.tools import BUILTIN_SPECS
from sandbox.tools.registry import ToolRegistry

pytestmark = pytest.mark.anyio


def host(make_config: Any, ws: Path, extra: str = "") -> Any:
    return make_config(
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}\n{extra}"
    )


def noop_registry() -> ToolRegistry:
    registry = ToolRegistry((s, None) for s in BUILTIN_SPECS)

    @registry.tool(category="custom")
    async def noop(ctx: Any, n: int = 0) -> int:
        """Do nothing."""
        return n

    return registry


@pytest.mark.slow
async def test_closed_sessions_leave_nothing_behind(make_config: Any, tmp_path: Path) -> None:
    """200 sessions opened, called and closed: the policy cache, loop memory and journal bookkeeping stay empty.

    (bench/sessions.py runs 10,000 and prints memory; here the claim is that nothing is left.)"""
    config = host(make_config, tmp_path / "ws", "tools: {profile: full}")
    for journal in (True, False):
        async with Orchestrator(config, registry=noop_registry(), journal=journal) as orch:
            for i in range(200):
                session = orch.session(f"agent:a:s{i}")
                assert (await session.call("noop", {"n": i})).ok
                await session.close()
            assert len(orch.policy._cache) == 0
            assert isinstance(orch.loops.store, MemoryLoopStore) != journal
            if isinstance(orch.loops.store, MemoryLoopStore):
                assert not orch.loops.store.calls and not orch.loops.store.tripped
            if orch.journal is not None:
                assert not orch.journal._pending and orch.journal._writer.backlog() == 0
                assert len(orch.journal.events(limit=10**9)) == 200 * 6


def test_policy_cache_is_bounded_for_sessions_never_closed(make_config: Any, tmp_path: Path) -> None:
    """Sessions that are never closed fill the policy cache only up to its bound; evicted ones resolve the same."""
    config = host(make_config, tmp_path / "ws")
    resolver = PolicyResolver(config, max_identities=100)
    first = resolver.resolve(Identity("a", "agent:a:s0"))
    for i in range(1, 1000):
        resolver.resolve(Identity("a", f"agent:a:s{i}"))
    assert len(resolver._cache) == 100 and len(resolver._outcomes) == 1
    again = resolver.resolve(Identity("a", "agent:a:s0"))
    assert again is not first and again.allowed == first.allowed and again.decisions == first.decisions


@pytest.mark.anyio
async def test_memory_loop_store_is_bounded() -> None:
    """The in-memory loop history keeps at most max_sessions sessions, each breaker going with its session."""
    store = MemoryLoopStore(max_sessions=50)
    for i in range(500):
        await store.loop_add("t", f"s{i}", "exec", "a", "r")
        await store.loop_trip("t", f"s{i}")
    assert len(store.calls) == 50 and store.tripped <= set(store.calls) and len(store.tripped) == 50
    assert (await store.loop_recent("t", "s499", 10))[0] and not (await store.loop_recent("t", "s0", 10))[0]


class FakeSandbox:
    """Just enough of a sandbox for the manager's bookkeeping."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.id = f"id-{spec.name}"
        self.gone = False

    def set_reviver(self, revive: Any) -> None:
        """Unused: nothing dies here."""


class FakeBackend:
    """Counts creations; `ensure` yields, so concurrent callers really overlap."""

    def __init__(self) -> None:
        self.ensured: list[str] = []
        self.removed: list[str] = []

    async def image_id(self, ref: str) -> str:
        return "sha256:fake"

    async def ensure(self, spec: SandboxSpec) -> FakeSandbox:
        await anyio.sleep(0.01)
        self.ensured.append(spec.name)
        return FakeSandbox(spec)

    async def remove(self, name_or_id: str) -> None:
        await anyio.lowlevel.checkpoint()
        self.removed.append(name_or_id)

    def warm_pool(self, manager: object) -> None:
        """No warm pool (an optional capability of the protocol)."""

    def egress(self) -> None:
        """No egress proxies."""


def sandboxed(make_config: Any, tmp_path: Path) -> Any:
    return make_config(
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: session}}}}, list: [{{id: a, workspace: '{tmp_path / 'ws'}'}}]}}"
    )


@pytest.mark.slow
async def test_manager_maps_are_bounded_and_emptied_on_close(
    make_config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session sandboxes never closed stay within the bound; closed ones leave no entry, spec, claim or lock."""
    monkeypatch.setattr(manager_module, "MAX_REMEMBERED", 20)  # the bound, small enough to reach quickly
    config = sandboxed(make_config, tmp_path)
    manager = SandboxManager(config, FakeBackend())  # type: ignore[arg-type]
    orch = Orchestrator(config, journal=False)
    agent = orch.policy.agent("a")
    for i in range(60):
        await manager.sandbox_for(agent, f"agent:a:s{i}")
    sizes = [len(m) for m in (manager._entries, manager._specs, manager._names, manager._last_used_written)]
    assert max(sizes) == 20 and not manager._locks
    for i in range(40, 60):
        assert await manager.close_session(agent, f"agent:a:s{i}")
    assert not manager._entries and not manager._specs and not manager._names and not manager._locks
    assert not manager._last_used_written
    # the state dir's record of last use keeps the 40 never closed (for prune), not the 20 closed
    assert len(manager.last_used()) == 40
    manager._last_used.flush()
    assert len(json.loads((config.state_dir / "last-used.json").read_text())) == 40


async def test_manager_lock_is_not_dropped_while_held(make_config: Any, tmp_path: Path) -> None:
    """Twenty concurrent first calls of one session create its sandbox once, and the lock goes only after."""
    config = sandboxed(make_config, tmp_path)
    backend = FakeBackend()
    manager = SandboxManager(config, backend)  # type: ignore[arg-type]
    agent = Orchestrator(config, journal=False).policy.agent("a")
    boxes: list[Any] = []

    async def first_call() -> None:
        boxes.append(await manager.sandbox_for(agent, "agent:a:x"))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(first_call)
        await anyio.sleep(0.005)
        assert len(manager._locks) == 1  # held by one, awaited by the others
    assert len(backend.ensured) == 1 and len({id(b) for b in boxes}) == 1 and not manager._locks

    async with anyio.create_task_group() as tg:  # a close racing calls: still one sandbox at a time
        tg.start_soon(manager.close_session, agent, "agent:a:x")
        tg.start_soon(first_call)
        tg.start_soon(first_call)
    assert not manager._locks


async def test_a_closed_session_leaves_no_folder_in_the_state_dir(make_config: Any, tmp_path: Path) -> None:
    """Its record of files seen and of processes started goes with it: one folder per session
    closed stayed for good."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("hello\n")
    async with Orchestrator(host(make_config, ws)) as orch:
        kept = orch.session(agent="a", key="agent:a:kept")
        assert (await kept.call("read", {"path": "f.txt"})).ok
        gone = orch.session(agent="a", key="agent:a:gone")
        assert (await gone.call("read", {"path": "f.txt"})).ok
        assert (await gone.call("exec", {"command": "sleep 30", "background": True})).ok
        folder = gone.state_dir
        assert (folder / "file-states.json").exists()
        assert await gone.close() == ["agent:a:gone"]
        assert not folder.exists()
        assert kept.state_dir.exists()  # another session's stays
