"""The sessions tools on the host backend (mode off): lineage, narrowing, limits, visibility,
inbox, status and the cascade. Container behaviour (the child's own sandbox, /parent read-only,
a cascade that removes containers, kill -9 half-way) is in test_sessions_docker.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.journal.store import Approval
from sandbox.testing import capture_logs

pytestmark = pytest.mark.anyio

PARENT = "agent:a:work"


def config(make_config: Any, tmp_path: Path, extra: str = "", subagents: str = "") -> Any:
    ws, other = tmp_path / "ws", tmp_path / "ws-b"
    return make_config(f"""
tools:
  profile: full
  subagents: {{max_spawn_depth: 2, {subagents}}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: a, workspace: "{ws}"}}
    - {{id: helper, workspace: "{ws}-h"}}
    - {{id: b, tenant: other, workspace: "{other}"}}
{extra}""")


async def spawn(sess: Any, **args: Any) -> Any:
    result = await sess.call("sessions_spawn", {"task": "look around", **args})
    return result


async def test_spawn_records_lineage_and_the_child_policy(make_config: Any, tmp_path: Path) -> None:
    """The child's key, depth and task are durable; its tools pass the sub-agent layer."""
    async with Orchestrator(config(make_config, tmp_path)) as orch:
        parent = orch.session(PARENT)
        r = await spawn(parent, name="scout")
        assert r.ok, r
        key = f"{PARENT}:subagent:scout"
        assert r.output["session"] == key and r.output["depth"] == 1 and r.output["parent"] == PARENT
        [child] = orch.children(PARENT, tenant="default")
        assert child.key == key and child.task == "look around" and child.created_by_call == r.call_id
        names = {t.name for t in orch.session(key).tools()}
        assert "exec" in names and "session_status" not in names and "sessions_send" not in names
    async with Orchestrator(config(make_config, tmp_path)) as again:  # durable: another process sees it
        assert [c.key for c in again.children(PARENT, tenant="default")] == [key]


async def test_a_spawns_log_line_has_the_tasks_size_not_its_text(make_config: Any, tmp_path: Path) -> None:
    """A task is a model's words (a token pasted into it, say): the service's log, which an operator
    ships elsewhere, says how long it was; the registry and the parent's tools keep the text."""
    task = "deploy with GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789"
    async with Orchestrator(config(make_config, tmp_path)) as orch:
        with capture_logs("INFO") as records:
            assert (await orch.session(PARENT).call("sessions_spawn", {"task": task, "name": "t"})).ok
        [spawned] = [r for r in records if r["event"] == "session_spawned"]
        assert spawned["task_chars"] == len(task) and "task" not in spawned
        assert "ghp_" not in repr(records)
        assert [c.task for c in orch.children(PARENT, tenant="default")] == [task]


async def test_tools_argument_only_narrows(make_config: Any, tmp_path: Path) -> None:
    """`tools` keeps the named tools the child already had; it cannot add one the policy denies."""
    async with Orchestrator(config(make_config, tmp_path, subagents="tools: {deny: [write]}")) as orch:
        parent = orch.session(PARENT)
        r = await spawn(parent, name="reader", tools=["read", "write", "group:fs"])
        assert r.ok, r
        child = orch.session(r.output["session"])
        names = {t.name for t in child.tools()}
        assert "read" in names and "write" not in names and "exec" not in names
        denied = await child.call("exec", {"command": "true"})
        assert denied.error is not None and denied.error.code in ("TOOL_NOT_FOUND", "PERMISSION_DENIED"), denied


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        ({"tools": []}, "INVALID_ARGUMENTS", "at least one tool"),
        ({"tools": ["no_such_tool"]}, "INVALID_ARGUMENTS", "unknown tools"),
        ({"name": "Bad Name"}, "INVALID_ARGUMENTS", "name"),
        ({"agent": "helper"}, "PERMISSION_DENIED", "allow_agents"),
    ],
)
async def test_bad_spawns_are_clear_errors(
    make_config: Any, tmp_path: Path, args: dict[str, Any], code: str, words: str
) -> None:
    """Each refusal names what to change; nothing is recorded."""
    async with Orchestrator(config(make_config, tmp_path)) as orch:
        r = await spawn(orch.session(PARENT), **args)
        assert r.error is not None and r.error.code == code and words in r.error.message, r
        assert orch.children(PARENT, tenant="default") == []


async def test_other_agents_only_when_allowed_and_never_across_tenants(make_config: Any, tmp_path: Path) -> None:
    """allow_agents lets a session spawn another agent's child in its tenant, not in another."""
    async with Orchestrator(config(make_config, tmp_path, subagents="allow_agents: [helper, b]")) as orch:
        ok = await spawn(orch.session(PARENT), agent="helper", name="h")
        assert ok.ok and ok.output["session"] == "agent:helper:work:subagent:h", ok
        other = await spawn(orch.session(PARENT), agent="b", name="x")
        assert other.error is not None and other.error.code == "PERMISSION_DENIED" and "tenant" in other.error.message


async def test_depth_and_fan_out_limits(make_config: Any, tmp_path: Path) -> None:
    """max_children open children at a time; at max_spawn_depth a child cannot spawn further."""
    async with Orchestrator(config(make_config, tmp_path, subagents="max_children: 2")) as orch:
        parent = orch.session(PARENT)
        assert (await spawn(parent, name="c1")).ok and (await spawn(parent, name="c2")).ok
        third = await spawn(parent, name="c3")
        assert (
            third.error is not None and third.error.code == "QUOTA_EXCEEDED" and "max_children" in third.error.message
        )
        await orch.session(f"{PARENT}:subagent:c2").close()  # room for one more
        dup = await spawn(parent, name="c1")
        assert dup.error is not None and dup.error.code == "CONFLICT" and "choose another name" in dup.error.message
        child = orch.session(f"{PARENT}:subagent:c1")
        grand = await spawn(child, name="g")
        assert grand.ok and grand.output["depth"] == 2, grand
        leaf = await spawn(orch.session(grand.output["session"]), name="too-deep")
        assert leaf.error is not None and leaf.error.code in ("TOOL_NOT_FOUND", "PERMISSION_DENIED"), leaf


async def test_visibility_tree_by_default(make_config: Any, tmp_path: Path) -> None:
    """A parent sees its children; a child sees itself, not its sibling or its parent."""
    async with Orchestrator(config(make_config, tmp_path)) as orch:
        parent = orch.session(PARENT)
        a = (await spawn(parent, name="a1")).output["session"]
        b = (await spawn(parent, name="b1")).output["session"]
        listed = await parent.call("sessions_list", {})
        assert {s["session"] for s in listed.output["sessions"]} == {PARENT, a, b}
        child = orch.session(a)
        mine = await child.call("sessions_list", {})
        assert {s["session"] for s in mine.output["sessions"]} == {a}
        for target in (b, PARENT):
            peek = await child.call("sessions_history", {"session": target})
            assert peek.error is not None and peek.error.code == "PERMISSION_DENIED", peek


async def test_visibility_agent_lets_family_see(make_config: Any, tmp_path: Path) -> None:
    """With visibility: agent, a child reads its parent's history."""
    async with Orchestrator(config(make_config, tmp_path, subagents="visibility: agent")) as orch:
        parent = orch.session(PARENT)
        await parent.call("read", {"path": "nothing.txt"})
        a = (await spawn(parent, name="a1")).output["session"]
        seen = await orch.session(a).call("sessions_history", {"session": PARENT})
        assert seen.ok and any(i.get("tool") == "read" for i in seen.output["items"]), seen


async def test_main_session_sees_its_agent_and_never_another_tenant(make_config: Any, tmp_path: Path) -> None:
    """agent:a:main lists a's sessions; agent:b:main (another tenant) cannot read them."""
    async with Orchestrator(config(make_config, tmp_path)) as orch:
        parent = orch.session(PARENT)
        await parent.call("read", {"path": "x.txt"})
        a = (await spawn(parent, name="a1")).output["session"]
        main = await orch.session("agent:a:main").call("sessions_list", {})
        assert {PARENT, a} <= {s["session"] for s in main.output["sessions"]}
        intruder = orch.session("agent:b:main")
        listed = await intruder.call("sessions_list", {})
        assert {s["session"] for s in listed.output["sessions"]} == {"agent:b:main"}
        for target in (PARENT, a):
            peek = await intruder.call("sessions_history", {"session": target})
            assert peek.error is not None and peek.error.code == "PERMISSION_DENIED"
            sent = await intruder.call("sessions_send", {"session": target, "text": "hi"})
            assert sent.error is not None and sent.error.code == "PERMISSION_DENIED"
        assert orch.messages(a, tenant="default") == []


async def test_send_history_and_events(make_config: Any, tmp_path: Path) -> None:
    """A message lands in the child's inbox, its history and the host application's listener."""
    events: list[tuple[str, dict[str, Any]]] = []
    async with Orchestrator(config(make_config, tmp_path)) as orch:
        orch.sessions.add_listener(lambda kind, data: events.append((kind, data)))
        parent = orch.session(PARENT)
        child = (await spawn(parent, name="c")).output["session"]
        sent = await parent.call("sessions_send", {"session": child, "message": "start with README"})
        assert sent.ok, sent
        [msg] = orch.messages(child, tenant="default")
        assert msg.sender == PARENT and msg.text == "start with README"
        history = await parent.call("sessions_history", {"session": child})
        assert history.output["task"] == "look around"
        assert [i["text"] for i in history.output["items"] if i["kind"] == "message"] == ["start with README"]
        too_long = await parent.call("sessions_send", {"session": child, "text": "x" * 40_000})
        assert too_long.error is not None and too_long.error.code == "INVALID_ARGUMENTS"
    assert [k for k, _ in events] == ["session_spawned", "session_message"]
    assert events[0][1]["session"] == child


async def test_status_reports_policy_limits_and_usage(make_config: Any, tmp_path: Path) -> None:
    """session_status names the tools, the lineage, the limits and the open children."""
    async with Orchestrator(config(make_config, tmp_path)) as orch:
        parent = orch.session(PARENT)
        await spawn(parent, name="c")
        status = await parent.call("session_status", {})
        out = status.output
        assert status.ok and out["session"] == PARENT and out["sandboxed"] is False and out["depth"] == 0
        assert "sessions_spawn" in out["tools"] and out["limits"]["max_children"] == 5
        assert out["usage"]["open_children"] == 1 and out["usage"]["calls"] >= 1


async def test_cascade_closes_descendants_and_cancels_their_approvals(make_config: Any, tmp_path: Path) -> None:
    """Closing the parent closes child and grandchild, denies their pending approvals, refuses later calls."""
    async with Orchestrator(config(make_config, tmp_path)) as orch:
        parent = orch.session(PARENT)
        child = (await spawn(parent, name="c")).output["session"]
        grand = (await spawn(orch.session(child), name="g")).output["session"]
        assert orch.journal is not None
        orch.journal.add_approval(Approval("ap-g", "call-g", "t", grand, "a", "exec", {}, "pending", "", 0.0, None))
        closed = await parent.close()
        assert closed == [grand, child, PARENT]
        assert orch.children(PARENT, tenant="default") == [] and orch.children(child, tenant="default") == []
        approval = orch.journal.approval("ap-g")
        assert approval is not None and approval.status == "denied" and "cancelled" in approval.reason
        late = await orch.session(grand).call("read", {"path": "x"})
        assert late.error is not None and late.error.code == "CONFLICT" and "closed" in late.error.message
        assert orch.sessions.registry.pending_cascades() == []


async def test_recover_finishes_a_cascade_that_was_begun(make_config: Any, tmp_path: Path) -> None:
    """A cascade marked but not finished (the orchestrator died) is finished by recover()."""
    cfg = config(make_config, tmp_path)
    async with Orchestrator(cfg) as orch:
        parent = orch.session(PARENT)
        child = (await spawn(parent, name="c")).output["session"]
        orch.sessions.registry.begin_cascade("default", PARENT, "a")  # ... and then it died
    async with Orchestrator(cfg) as orch:
        outcomes = await orch.recover()
        assert {o.get("session") for o in outcomes} >= {child, PARENT}
        assert orch.children(PARENT, tenant="default") == [] and orch.sessions.registry.pending_cascades() == []


async def test_a_child_never_gets_more_than_its_parent_has(make_config: Any, tmp_path: Path) -> None:
    """A parent narrowed by its provider layer spawns a child: the child is as narrow (its own
    resolution has no provider), and `tools` naming something the parent lacks does not add it."""
    extra = "  by_provider: {acme: {allow: [read, exec, sessions_spawn]}}\n"
    text = f"""
tools:
  profile: full
{extra}  subagents: {{max_spawn_depth: 2}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list: [{{id: a, workspace: "{tmp_path / "ws"}"}}]
"""
    async with Orchestrator(make_config(text)) as orch:
        parent = orch.session(PARENT, provider="acme")
        assert {t.name for t in parent.tools()} == {"read", "exec", "sessions_spawn"}
        r = await spawn(parent, name="c")
        assert r.ok and set(r.output["tools"]) <= {"read", "exec", "sessions_spawn"}, r
        child = orch.session(r.output["session"])
        assert {t.name for t in child.tools()} <= {"read", "exec", "sessions_spawn"}
        wider = await spawn(parent, name="w", tools=["write"])
        assert wider.error is not None and "none of" in wider.error.message


async def test_explain_and_tools_see_a_spawned_session_as_it_runs(make_config: Any, tmp_path: Path) -> None:
    """The CLI resolves a child with its spawn layer: `tools` offers only what the child may call."""
    import json

    from tests.cli_helpers import run_cli

    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(
        f"state_dir: {tmp_path / 'state'}\ntools: {{profile: full}}\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{tmp_path / 'ws'}'}}]}}\n"
    )
    from sandbox import load_config

    async with Orchestrator(load_config(cfg_path)) as orch:
        r = await spawn(orch.session(PARENT), name="r", tools=["read"])
        assert r.ok, r
    key = r.output["session"]
    offered = json.loads(run_cli("--config", str(cfg_path), "tools", "--session", key).stdout)
    assert [t["function"]["name"] for t in offered] == ["read"]
    explained = json.loads(run_cli("--config", str(cfg_path), "explain", "--session", key, "--json").stdout)
    assert [layer["name"] for layer in explained["layers"]][-1] == "spawn"


def test_an_inheriting_child_in_a_shared_container_gets_no_mount_of_its_own(tmp_path: Path) -> None:
    """sandbox_scope: inherit in agent scope: the child uses the agent's container as it is (no
    /parent mount that would give the shared container a second spec)."""
    from sandbox.config import effective_agent, load_config_text
    from sandbox.sessions.child import child_agent
    from sandbox.sessions.registry import Child

    def agent_for(scope: str) -> Any:
        text = (
            f"state_dir: {tmp_path}\ntools: {{subagents: {{sandbox_scope: inherit}}}}\n"
            f"agents: {{defaults: {{sandbox: {{mode: all, scope: {scope}}}}}}}\n"
        )
        cfg = load_config_text(text)
        row = Child("k", "default", "main", "p", 1, "n", "t", None, "ro", str(tmp_path), "c", 0.0, "open", None)
        return child_agent(cfg, effective_agent(cfg, "main"), row)

    shared = agent_for("agent")
    assert shared.sandbox.scope == "agent" and shared.parent_view is None
    own = agent_for("session")
    assert own.parent_view == (str(tmp_path), True)


@pytest.mark.slow
async def test_a_spawn_racing_the_parents_close_leaves_nothing_open(make_config: Any, tmp_path: Path) -> None:
    """Spawning under a session while it is being closed: either refused or closed with it."""
    import anyio

    async with Orchestrator(config(make_config, tmp_path)) as orch:
        for round_ in range(15):
            parent = orch.session(f"agent:a:race{round_}")
            child_key = (await spawn(parent, name="c")).output["session"]
            child = orch.session(child_key)
            async with anyio.create_task_group() as tg:
                tg.start_soon(child.call, "sessions_spawn", {"task": "x", "name": "g"})
                tg.start_soon(parent.close)
            registry = orch.sessions.registry
            left = [d for d in registry.descendants("default", parent.key, include_closed=True) if d.status == "open"]
            assert left == [], left
            late = await spawn(child, name="late")
            assert late.error is not None and late.error.code == "CONFLICT", late


async def test_another_agents_child_may_not_run_looser_than_its_parent(make_config: Any, tmp_path: Path) -> None:
    """A sandboxed parent cannot spawn a child of an agent that runs on the host."""
    cfg = make_config(f"""
runtime: {{backend: host}}
tools: {{profile: full, subagents: {{allow_agents: [hosty]}}}}
agents:
  list:
    - {{id: a, workspace: "{tmp_path / "wa"}", sandbox: {{mode: all}}}}
    - {{id: hosty, workspace: "{tmp_path / "wh"}", sandbox: {{mode: 'off'}}}}
""")
    async with Orchestrator(cfg) as orch:
        parent = orch.session(PARENT)
        assert parent.sandboxed
        r = await spawn(parent, agent="hosty", name="h")
        assert r.error is not None and r.error.code == "PERMISSION_DENIED" and "on the host" in r.error.message, r


@pytest.mark.slow
async def test_sizes_are_capped_and_history_shows_the_newest(make_config: Any, tmp_path: Path) -> None:
    """A task over 32,000 characters is refused; history shows the latest items, long texts cut."""
    from sandbox.sessions import service

    async with Orchestrator(config(make_config, tmp_path)) as orch:
        parent = orch.session(PARENT)
        big = await spawn(parent, task="x" * 40_000, name="big")
        assert big.error is not None and big.error.code == "INVALID_ARGUMENTS" and "task" in big.error.message
        named = await spawn(parent, name="subagent")
        assert named.error is not None and named.error.code == "INVALID_ARGUMENTS"
        child = (await spawn(parent, name="c")).output["session"]
        for i in range(30):
            await parent.call("sessions_send", {"session": child, "text": f"m{i}"})
        await parent.call("sessions_send", {"session": child, "text": "y" * 10_000})
        history = await parent.call("sessions_history", {"session": child, "limit": 5})
        texts = [i["text"] for i in history.output["items"] if i["kind"] == "message"]
        assert texts[:4] == ["m26", "m27", "m28", "m29"] and "chars cut" in texts[-1] and len(texts[-1]) < 5_000
        orch.sessions.registry.messages("default", child)  # the inbox holds all of them
        original = service.MAX_INBOX
        service.MAX_INBOX = 31
        try:
            full = await parent.call("sessions_send", {"session": child, "text": "one too many"})
        finally:
            service.MAX_INBOX = original
        assert full.error is not None and full.error.code == "QUOTA_EXCEEDED"


async def test_sub_agent_keys_exist_only_through_a_spawn(make_config: Any, tmp_path: Path) -> None:
    """A hand-made `...:subagent:x` key is refused: it would have no lineage, sandbox or cascade."""
    from sandbox.errors import UsageError

    async with Orchestrator(config(make_config, tmp_path)) as orch:
        with pytest.raises(UsageError) as err:
            orch.session(f"{PARENT}:subagent:x")
        assert "sessions_spawn" in err.value.message


async def test_another_agents_child_is_seen_through_its_parent_only(make_config: Any, tmp_path: Path) -> None:
    """A child a's session spawned as agent helper is not visible to helper's main session."""
    async with Orchestrator(config(make_config, tmp_path, subagents="allow_agents: [helper]")) as orch:
        child = (await spawn(orch.session(PARENT), agent="helper", name="h")).output["session"]
        listed = await orch.session("agent:helper:main").call("sessions_list", {})
        assert child not in {s["session"] for s in listed.output["sessions"]}
        sent = await orch.session("agent:helper:main").call("sessions_send", {"session": child, "text": "hi"})
        assert sent.error is not None and sent.error.code == "PERMISSION_DENIED"
        mine = await orch.session(PARENT).call("sessions_list", {})
        assert child in {s["session"] for s in mine.output["sessions"]}


async def test_history_holds_the_tenants_calls_whatever_a_neighbour_writes_under_the_same_key(
    make_config: Any, tmp_path: Path
) -> None:
    """A neighbour tenant's 300 events under the same session key, newer: this tenant's history still shows its
    call, and status counts its own calls only (before, the LIMIT took the neighbour's rows, then filtered)."""
    async with Orchestrator(config(make_config, tmp_path)) as orch:
        parent = orch.session(PARENT)
        assert (await parent.call("read", {"path": "x.txt"})).error is not None  # a call, journaled (file missing)
        journal = orch.journal
        assert journal is not None
        for i in range(300):
            journal.append(
                trace_id="n", call_id=f"neighbour-{i}", session=PARENT, tenant="other", agent="a",
                tool="exec", stage="finished",
            )  # fmt: skip
        history = await parent.call("sessions_history", {"session": PARENT, "limit": 5})
        assert history.ok, history
        calls = [i for i in history.output["items"] if i["kind"] == "call"]
        assert [c["tool"] for c in calls if c["tool"] == "read"] == ["read"], calls
        assert not [c for c in calls if c["call_id"].startswith("neighbour-")]
        status = await parent.call("session_status", {})
        assert status.output["usage"]["calls"] == 3, status  # read, sessions_history, session_status


async def test_old_messages_and_closed_lineage_go_with_retention(make_config: Any, tmp_path: Path) -> None:
    """A month of sub-agents spawned and closed, and of messages sent, must not stay in the
    registry for good: what is older than `journal.retention.max_age` goes (the service runs it);
    an open session's lineage stays whatever its age."""
    import sqlite3
    import time

    async with Orchestrator(config(make_config, tmp_path)) as orch:
        parent = orch.session(PARENT)
        closed = (await spawn(parent, name="closed")).output["session"]
        still_open = (await spawn(parent, name="open")).output["session"]
        for target in (closed, still_open):
            assert (await parent.call("sessions_send", {"session": target, "message": "hello"})).ok
        assert await orch.session(closed).close() == [closed]
        db = sqlite3.connect(str(orch.sessions.path), isolation_level=None)
        db.execute("UPDATE inbox SET created_at = created_at - 86400")
        db.execute("UPDATE lineage SET created_at = created_at - 86400, closed_at = closed_at - 86400")
        assert (await parent.call("sessions_send", {"session": still_open, "message": "recent"})).ok
        assert orch.sessions.registry.prune(time.time() - 3600) == 3  # two messages, one closed child
        assert orch.sessions.registry.child(closed) is None
        assert orch.sessions.registry.child(still_open) is not None  # open: kept, however old
        left = orch.sessions.registry.messages("default", still_open)
        assert [m.text for m in left] == ["recent"]
        db.close()


def test_a_registry_prune_goes_in_short_batches_by_the_time_index(tmp_path: Path) -> None:
    """A month of messages was deleted by one statement that scanned the whole inbox and held
    every writer (this process's and the other service processes') until it ended. Now each
    batch is its own transaction of PRUNE_BATCH rows found through the time index, and a message
    sent between batches is never lost."""
    import sqlite3
    import time

    from sandbox.sessions import registry as registry_module

    registry = registry_module.Registry(tmp_path / "sessions.sqlite3")
    n = 2 * registry_module.PRUNE_BATCH + 7
    for i in range(n):
        registry.send("t", "agent:a:s", "agent:a:main", f"m{i}")
    db = sqlite3.connect(tmp_path / "sessions.sqlite3", isolation_level=None)
    indexes = "SELECT name FROM sqlite_master WHERE name IN ('inbox_created', 'lineage_closed')"
    # an open (maybe on the event loop) builds nothing: on a registry of before, the first
    # prune builds them, in its worker thread
    assert db.execute(indexes).fetchall() == []
    assert registry.prune(0.0) == 0
    assert len(db.execute(indexes).fetchall()) == 2
    db.execute("UPDATE inbox SET created_at = created_at - 86400")
    for sql in (registry_module.PRUNE_INBOX, registry_module.PRUNE_LINEAGE):
        plan = " ".join(str(r) for r in db.execute("EXPLAIN QUERY PLAN " + sql, (0.0, 1)).fetchall())
        assert "INDEX inbox_created (created_at<?)" in plan or "INDEX lineage_closed (closed_at<?)" in plan, plan
    statements: list[str] = []
    registry._db.set_trace_callback(statements.append)
    sent_between = False
    real_execute = registry._db.execute

    class Interleaved:  # another writer's message lands between two batches
        def execute(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
            nonlocal sent_between
            cursor = real_execute(sql, args)
            if sql.startswith("DELETE FROM inbox") and not sent_between:
                sent_between = True
                db.execute(
                    "INSERT INTO inbox(tenant, session, sender, text, created_at) VALUES (?,?,?,?,?)",
                    ("t", "agent:a:s", "agent:a:main", "during", time.time()),
                )
            return cursor

        def __getattr__(self, name: str) -> Any:
            return getattr(registry._db, name)

    registry._db = Interleaved()  # type: ignore[assignment]
    assert registry.prune(time.time() - 3600) == n
    deletes = [s for s in statements if s.startswith("DELETE FROM inbox")]
    assert len(deletes) == 3 and all("LIMIT" in s for s in deletes)
    assert [m.text for m in registry.messages("t", "agent:a:s")] == ["during"]
    db.close()


async def test_the_service_s_keeper_prunes_the_registry_on_its_period(make_config: Any, tmp_path: Path) -> None:
    import sqlite3

    import anyio

    async with Orchestrator(config(make_config, tmp_path)) as orch:
        parent = orch.session(PARENT)
        child = (await spawn(parent, name="c")).output["session"]
        assert (await parent.call("sessions_send", {"session": child, "message": "old"})).ok
        db = sqlite3.connect(str(orch.sessions.path), isolation_level=None)
        db.execute("UPDATE inbox SET created_at = created_at - 86400")
        db.close()
        with anyio.move_on_after(0.2):
            await orch.sessions.keep_bounded(3600.0, 0.05)  # as app.py starts it, from journal.retention
        assert orch.sessions.registry.messages("default", child) == []
        await orch.sessions.keep_bounded(None, 0.05)  # no max_age: returns at once, keeps all
