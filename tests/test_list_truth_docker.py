"""`sandbox list` tells the truth (issue 24, item 18): warm-pool members are shown as pool members
matching their pool's config (they read STALE, as if drifted), and a spawned child's sandbox is
matched against the agent as the child runs it (its own sandbox, its parent's view), not flagged
as not matching the config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator, load_config
from sandbox.runtime import lifecycle
from tests.cli_helpers import run_cli

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


def write_config(tmp_path: Path, instance: str, body: str) -> Path:
    path = tmp_path / "sandbox.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\ninstance: {instance}\n{body}")
    return path


async def listed(path: Path) -> list[dict[str, Any]]:
    done = await anyio.to_thread.run_sync(lambda: run_cli("list", "--json", config=path, timeout=120))
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


async def test_pool_members_are_listed_as_pool_members_not_stale(tmp_path: Path, instance: str) -> None:
    """A pool of two, one handed to a session: the free member is `pool` and matches its pool's
    config; the handed-out one is the session's and matches; nothing reads STALE."""
    path = write_config(
        tmp_path, instance, "agents: {defaults: {sandbox: {mode: all, scope: session, pool: {size: 2}}}}\n"
    )
    async with Orchestrator(load_config(path)) as orch:
        assert await orch.fill_pools() == 2
        assert (await orch.session("agent:main:taken").call("exec", {"command": "true"})).ok
        found = await lifecycle.rows(orch.manager)
        rows = await listed(path)
        text = await anyio.to_thread.run_sync(lambda: run_cli("list", config=path, timeout=120))
    pool = [r for r in found if r.role == "pool"]
    assert pool and all(r.config_match is True for r in pool), found
    taken = next(r for r in found if r.info.session == "agent:main:taken")
    assert taken.role is None and taken.config_match is True, taken
    assert {r["role"] for r in rows} >= {"pool", None} and all(r["config_match"] is True for r in rows), rows
    assert "STALE" not in text.stdout and " pool " in text.stdout, text.stdout


async def test_a_drifted_pool_member_is_still_stale(tmp_path: Path, instance: str) -> None:
    """The pool's config changed (another pids limit): its old free members are pool members that
    no longer match (the pool sweeps them); `list` says so."""
    body = "agents: {{defaults: {{sandbox: {{mode: all, scope: session, pool: {{size: 1}}, docker: {{pids_limit: {n}}}}}}}}}\n"
    path = write_config(tmp_path, instance, body.format(n=256))
    async with Orchestrator(load_config(path)) as orch:
        assert await orch.fill_pools() == 1
    write_config(tmp_path, instance, body.format(n=300))
    rows = await listed(path)
    pool = [r for r in rows if r["role"] == "pool"]
    assert pool and all(r["config_match"] is False for r in pool), rows


async def test_a_spawned_childs_sandbox_matches_the_config(tmp_path: Path, instance: str) -> None:
    """A parent spawns a child that runs a command: the child's sandbox (its own, with the parent's
    workspace at /parent) is listed as a child's and matches; the parent's matches too."""
    path = write_config(
        tmp_path, instance, "tools: {subagents: {max_children: 5}}\nagents: {defaults: {sandbox: {mode: all}}}\n"
    )
    async with Orchestrator(load_config(path)) as orch:
        parent = orch.session("agent:main:work")
        try:
            assert (await parent.call("exec", {"command": "true"})).ok
            spawned = await parent.call("sessions_spawn", {"task": "look", "name": "looker"})
            assert spawned.ok, spawned
            child = orch.session(spawned.output["session"])
            assert (await child.call("exec", {"command": "ls /parent >/dev/null && echo ok"})).ok
            found = await lifecycle.rows(orch.manager)
            rows = await listed(path)
        finally:
            await parent.close()
    mine = next(r for r in found if r.info.session == child.key)
    assert mine.role == "child" and mine.config_match is True, mine
    assert all(r.config_match is True for r in found), found
    assert any(r["role"] == "child" and r["config_match"] is True for r in rows), rows
    assert all(r["config_match"] is True for r in rows), rows


async def test_a_tenants_listing_holds_its_own_sandboxes_only(tmp_path: Path, instance: str) -> None:
    """The engine is asked for one tenant's sandboxes (the quota admission and GET /v1/sandboxes
    ask so: a neighbour's thousand sandboxes cost them nothing): tenant a's free pool member and
    its handed-out one, never tenant b's sandbox, and the other way round."""
    path = write_config(
        tmp_path,
        instance,
        "tenants: [{id: a}, {id: b}]\n"
        "agents:\n  list:\n"
        "    - {id: alpha, tenant: a, sandbox: {mode: all, scope: session, pool: {size: 1}}}\n"
        "    - {id: beta, tenant: b, sandbox: {mode: all, scope: session}}\n",
    )
    async with Orchestrator(load_config(path)) as orch:
        assert await orch.fill_pools() == 1
        assert (await orch.session("agent:alpha:s1").call("exec", {"command": "true"})).ok  # the member
        assert (await orch.session("agent:beta:s1").call("exec", {"command": "true"})).ok
        assert await orch.fill_pools() == 1
        every = await orch.manager.list()
        of_a = await orch.manager.list(tenant="a")
        of_b = await orch.manager.list(tenant="b")
        raw_b = await orch.backend.list(instance=orch.manager.instance, tenant="b")
        nobody = await orch.manager.list(tenant="nobody")
    assert {i.tenant for i in every} == {"a", "b"} and len(every) == 3
    assert {i.tenant for i in of_a} == {"a"} and len(of_a) == 2
    assert {i.session for i in of_a} == {"agent:alpha:s1", ""}  # the handed-out one shows its session
    assert [(i.tenant, i.session) for i in of_b] == [("b", "agent:beta:s1")]
    assert [i.id for i in raw_b] == [i.id for i in of_b]
    assert nobody == []
