"""Session commands: the lineage of spawned sessions, inboxes, closing (with cascade), recovery."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import click

from sandbox.cli import State, _emit, handled, json_option, main
from sandbox.escape import escape

if TYPE_CHECKING:
    from sandbox.engine.orchestrator import Orchestrator


def check_session_key(key: str) -> str:
    """The key, validated (imported when a command runs: `--help` stays light)."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.policy.sessions import check_session_key as check

    return check(key)


def _orchestrator(state: State) -> Orchestrator:
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.engine.orchestrator import Orchestrator

    return Orchestrator(state.config, registry=state.registry())


@main.group("sessions")
def sessions_group() -> None:
    """Spawned sessions: tree, inbox, close (cascades to descendants), recover."""


@sessions_group.command("tree")
@click.argument("session")
@click.option("--tenant", default="default", show_default=True)
@click.option("--all", "all_", is_flag=True, help="Closed descendants too.")
@json_option
@click.pass_obj
@handled
def sessions_tree(state: State, session: str, tenant: str, all_: bool, as_json: bool) -> None:
    """The sessions SESSION spawned, and theirs (with depth, status and task)."""
    check_session_key(session)
    orch = _orchestrator(state)
    try:
        registry = orch.sessions.registry if orch.sessions.path.exists() else None
        rows = registry.descendants(tenant, session, include_closed=all_) if registry else []
    finally:
        anyio.run(orch.aclose)
    data = [r.__dict__ for r in rows]
    lines = [
        f"{'  ' * (r.depth - 1)}{escape(r.key)}  {r.status}  parent view {r.parent_view}  task: {escape(r.task[:80])}"
        for r in rows
    ]
    _emit(data, as_json, "\n".join(lines) or f"{escape(session)} has no spawned sessions")


@sessions_group.command("inbox")
@click.argument("session")
@click.option("--tenant", default="default", show_default=True)
@json_option
@click.pass_obj
@handled
def sessions_inbox(state: State, session: str, tenant: str, as_json: bool) -> None:
    """Messages sent to SESSION (sessions_send), oldest first."""
    check_session_key(session)
    orch = _orchestrator(state)
    try:
        messages = orch.messages(session, tenant=tenant)
    finally:
        anyio.run(orch.aclose)
    lines = [
        f"{datetime.fromtimestamp(m.created_at, UTC):%H:%M:%S}  from {escape(m.sender)}: {escape(m.text)}"
        for m in messages
    ]
    _emit([m.__dict__ for m in messages], as_json, "\n".join(lines) or "no messages")


@sessions_group.command("close")
@click.argument("session")
@click.option("--agent", help="The agent, when the key does not name it.")
@json_option
@click.pass_obj
@handled
def sessions_close(state: State, session: str, agent: str | None, as_json: bool) -> None:
    """Close SESSION and every session it spawned: containers removed, processes killed, approvals denied."""
    check_session_key(session)

    async def go() -> list[str]:
        async with _orchestrator(state) as orch:
            return await orch.session(session, agent=agent).close()

    closed = anyio.run(go)
    _emit({"closed": closed}, as_json, "\n".join(f"closed {escape(k)}" for k in closed))


@sessions_group.command("recover")
@json_option
@click.pass_obj
@handled
def sessions_recover(state: State, as_json: bool) -> None:
    """After a crash: settle unfinished calls and finish cascades a killed orchestrator began."""

    async def go() -> list[dict[str, Any]]:
        async with _orchestrator(state) as orch:
            return await orch.recover(adopt=False)  # durable calls: adopted by a process that stays

    outcomes = anyio.run(go)
    lines = [f"{escape(str(o.get('session', '')))}  {escape(str(o.get('now', '')))}" for o in outcomes]
    _emit(outcomes, as_json, "\n".join(lines) or "nothing to recover")
