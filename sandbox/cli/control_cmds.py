"""Control commands: approvals, logs (the timeline of calls), status --deep."""

from __future__ import annotations

import contextlib
import json
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import click

from sandbox.cli import State, _emit, handled, json_option, main
from sandbox.errors import UsageError
from sandbox.escape import cut_marked, escape, escape_json

if TYPE_CHECKING:  # the journal (sqlite3) loads when a command uses it, not on every start
    from sandbox.journal.store import Approval, Event, Journal

PREVIEW_CHARS = 80  # of the arguments, per line of `approvals list`; the cut is always marked


def _journal(state: State) -> Journal:
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.journal.store import Journal

    return Journal(state.config.state_dir / "journal.sqlite3")


class _SharedApprovals:
    """The approvals of a shared store (`state.url: postgresql://...`), with the journal's calls:
    the service keeps them there, so the CLI reads and decides them there too."""

    def __init__(self, state: State) -> None:
        self._url = state.config.state.parsed()
        self._dir = state.config.state_dir

    def _run(self, op: Any) -> Any:
        from sandbox.state import open_store

        async def go() -> Any:
            async with open_store(self._url, self._dir) as store:
                return await op(store)

        return anyio.run(go)

    def approvals(self, status: str | None, *, raw: bool = False) -> list[Approval]:
        result: list[Approval] = self._run(lambda s: s.approvals(status, raw=raw))
        return result

    def approval(self, approval_id: str, *, raw: bool = False) -> Approval | None:
        found: Approval | None = self._run(lambda s: s.approval(approval_id, raw=raw))
        return found

    def decide(self, approval_id: str, status: str, reason: str = "") -> Approval:
        decided: Approval = self._run(lambda s: s.decide(approval_id, status, reason))
        return decided

    def close(self) -> None:
        """Each call opened and closed its own connection."""


def _approvals(state: State) -> Journal | _SharedApprovals:
    """Where approvals live: the shared store when state.url names PostgreSQL, else the journal."""
    if state.config.state.parsed().kind == "postgresql":
        return _SharedApprovals(state)
    return _journal(state)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3]


@main.group("approvals")
def approvals_group() -> None:
    """Calls waiting for a human: list, show, approve, deny."""


@approvals_group.command("list")
@click.option("--all", "all_", is_flag=True, help="Decided ones too.")
@json_option
@click.pass_obj
@handled
def approvals_list(state: State, all_: bool, as_json: bool) -> None:
    """Pending approvals (oldest first), with the exact arguments that will run."""
    journal = _approvals(state)
    # raw: a pending call is shown as it will run (masking could hide executable text)
    items = journal.approvals(None if all_ else "pending", raw=True)
    journal.close()
    data = [a.__dict__ for a in items]
    lines = [
        f"{escape(a.id)}  {a.status:<8} {escape(a.tool):<12} {escape(a.session)}  "
        f"{cut_marked(escape_json(a.arguments), PREVIEW_CHARS)}"
        for a in items
    ]
    if any(len(escape_json(a.arguments)) > PREVIEW_CHARS for a in items):
        lines.append("(arguments cut; `sandbox approvals show ID` prints them in full)")
    _emit(data, as_json, "\n".join(lines) or "no pending approvals")


@approvals_group.command("show")
@click.argument("approval_id")
@json_option
@click.pass_obj
@handled
def approvals_show(state: State, approval_id: str, as_json: bool) -> None:
    """One approval with every argument in full, exactly as it will run (control characters escaped)."""
    journal = _approvals(state)
    try:
        approval = journal.approval(approval_id, raw=True)
    finally:
        journal.close()
    if approval is None:
        raise UsageError(f"no approval {approval_id!r}; `sandbox approvals list --all` shows them")
    _emit(approval.__dict__, as_json, show_text(approval))


def show_text(a: Approval) -> str:
    """An approval as an approver reads it: who, what, and each argument whole."""
    lines = [
        f"approval  {escape(a.id)}  ({a.status}{', ' + escape(a.reason) if a.reason else ''})",
        f"tool      {escape(a.tool)}",
        f"session   {escape(a.session)}  (agent {escape(a.agent)})",
        f"call      {escape(a.call_id)}  trace {escape(a.trace_id)}",
        f"created   {_when(a.created)} UTC" + (f", decided {_when(a.decided)} UTC" if a.decided else ""),
        (
            "arguments, exactly as they will run (control characters shown as \\xNN / \\uNNNN):"
            if a.status == "pending"
            else "arguments (secrets masked as *** once decided; control characters shown as \\xNN / \\uNNNN):"
        ),
    ]
    for name, value in a.arguments.items():
        if isinstance(value, str):
            body = escape(value, multiline=True)
            size = f"{len(value):,} chars, {value.count(chr(10)) + 1} line(s)"
            lines.append(f"  {escape(str(name))}: ({size})")
            lines.extend(f"    | {line}" for line in body.split("\n"))
        else:
            lines.append(f"  {escape(str(name))}: {escape_json(value)}")
    if not a.arguments:
        lines.append("  (none)")
    return "\n".join(lines)


def _decide(state: State, approval_id: str, status: str, reason: str, as_json: bool) -> None:
    journal = _approvals(state)
    try:
        decided = journal.decide(approval_id, status, reason)
    finally:
        journal.close()
    _emit(decided.__dict__, as_json, escape(f"{decided.id}: {decided.status}" + (f" ({reason})" if reason else "")))


@approvals_group.command("approve")
@click.argument("approval_id")
@click.option("--reason", default="", help="Recorded with the decision.")
@json_option
@click.pass_obj
@handled
def approvals_approve(state: State, approval_id: str, reason: str, as_json: bool) -> None:
    """Let a waiting call run."""
    _decide(state, approval_id, "approved", reason, as_json)


@approvals_group.command("deny")
@click.argument("approval_id")
@click.option("--reason", default="", help="Told to the model (APPROVAL_DENIED).")
@json_option
@click.pass_obj
@handled
def approvals_deny(state: State, approval_id: str, reason: str, as_json: bool) -> None:
    """Refuse a waiting call."""
    _decide(state, approval_id, "denied", reason, as_json)


def _event_line(e: Event) -> str:
    # every field may carry text the model chose (a tool name, a path in a message): escaped
    shown: tuple[str, ...] = ("code", "message", "reason", "approval_id", "process_id", "waited_s")
    if e.stage == "egress":  # one request through the egress proxy
        shown = ("verdict", "method", "host", "port", "status", "bytes_up", "bytes_down", "reason")
    detail = {k: v for k, v in e.data.items() if k in shown}
    extra = " " + escape_json(detail) if detail else ""
    took = f" +{e.duration_ms:.1f}ms" if e.duration_ms is not None else ""
    return (
        f"{_when(e.ts)}  {escape(e.trace_id)}  {escape(e.call_id)}  {escape(e.tool):<12} {escape(e.stage):<18}"
        f"{took}{extra}"
    )


def _collect_cluster_egress(state: State, journal: Any) -> None:
    """On a cluster: every sandbox Pod's lines in its proxy's log (kubernetes/egress_log.py)."""
    import anyio

    from sandbox.runtime.kubernetes.backend import KubernetesBackend
    from sandbox.runtime.naming import instance_id

    async def collect() -> None:
        backend = KubernetesBackend(state.config)
        try:
            egress = backend.egress()
            assert egress is not None
            for info in await backend.list(instance=instance_id(state.config.state_dir, state.config.instance)):
                await egress.collect(journal, info.name)
        finally:
            await backend.aclose()

    try:
        anyio.run(collect)
    except Exception as exc:  # the journal still shows what was collected before
        click.echo(f"note: egress lines of the cluster's proxies not collected ({exc.__class__.__name__})", err=True)


def _collect_egress(state: State, journal: Any) -> None:
    """Bring the live egress proxies' request lines into the journal first; no engine: skipped."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.config.merge import agent_ids, effective_agent

    config = state.config
    if not any(effective_agent(config, a).sandbox.docker.network == "egress" for a in agent_ids(config)):
        return  # nothing to collect: no docker import, no engine needed
    if config.runtime.backend == "kubernetes":
        _collect_cluster_egress(state, journal)
        return
    try:
        # the engine only when an agent's network is egress
        import docker

        from sandbox.runtime.docker.egress_log import collect_instance
        from sandbox.runtime.naming import instance_id

        client = docker.from_env(timeout=10)
        try:
            collect_instance(journal, client, instance_id(config.state_dir, config.instance))
        finally:
            client.close()
    except Exception as exc:  # the journal still shows what was collected before
        click.echo(f"note: egress lines of live proxies not collected ({exc.__class__.__name__})", err=True)


@main.command()
@click.option("--trace", "trace_id", help="Only this trace.")
@click.option("--session", help="Only this session key.")
@click.option("--tenant", help="Only this tenant's events.")
@click.option("--since", help="Only events at or after: an age (30m, 2h, 1d) or a UTC time (2026-12-01T08:00).")
@click.option("--until", help="Only events at or before: an age or a UTC time, as --since.")
@click.option("--cursor", help="The next (older) page: the cursor the previous page printed.")
@click.option("--follow", is_flag=True, help="Keep printing new events.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Events per page (1 to 10,000): the newest ones, printed oldest first, before following.",
)
@json_option
@click.pass_obj
@handled
def logs(
    state: State,
    trace_id: str | None,
    session: str | None,
    tenant: str | None,
    since: str | None,
    until: str | None,
    cursor: str | None,
    follow: bool,
    limit: int,
    as_json: bool,
) -> None:
    """The timeline of calls from the journal, a page at a time (it never reads the whole journal)."""
    now = time.time()
    start, end = _moment(since, now, "--since"), _moment(until, now, "--until")
    journal = _journal(state)
    try:
        _collect_egress(state, journal)
        page = journal.page(
            tenant=tenant, session=session, trace_id=trace_id, since=start, until=end, cursor=cursor, limit=limit
        )
        events = list(reversed(page.events))  # a timeline reads oldest first
        last = page.events[0].id if page.events else journal.last_event_id()
        _print(events, as_json)
        if page.next_cursor is not None and not follow:
            click.echo(f"(older events: --cursor {page.next_cursor})", err=True)
        while follow:
            time.sleep(0.5)
            # new rows only (after the last one seen, whoever's it was): each poll reads what was written meanwhile
            found = journal.events(trace_id=trace_id, session=session, after_id=last)
            _print([e for e in found if _keep(e, tenant, end)], as_json)
            last = max([last, *(e.id for e in found)])
    except KeyboardInterrupt:
        pass
    finally:
        journal.close()


def _print(events: list[Event], as_json: bool) -> None:
    for e in events:
        click.echo(escape_json(e.__dict__) if as_json else _event_line(e))


def _keep(e: Event, tenant: str | None, until: float | None) -> bool:
    return (tenant is None or e.tenant == tenant) and (until is None or e.ts <= until)


def _moment(text: str | None, now: float, flag: str) -> float | None:
    """An age (`30m`: that long ago), a UTC time (ISO 8601) or Unix seconds, as Unix seconds."""
    if text is None:
        return None
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.journal.retention import parse_age

    age = parse_age(text.strip())
    if age is not None:
        return now - age
    with contextlib.suppress(ValueError):
        return float(text)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r}: give an age (30m, 2h, 1d, 1w) or a UTC time (2026-12-01T08:00)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@main.command()
@click.option("--deep", is_flag=True, help="Also policy, skills, sandboxes, approvals and journal health.")
@json_option
@click.pass_obj
@handled
def status(state: State, deep: bool, as_json: bool) -> None:
    """Where things stand: the journal, and with --deep everything else."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.policy import Identity

    journal = _journal(state)
    # cheap (no integrity check, no count of events): `sandbox doctor` reads the journal in full
    data: dict[str, Any] = {"journal": {**journal.health(), "retention": state.config.journal.retention.model_dump()}}
    if deep:
        # --deep only: the engine, the tools' code, the sandboxes
        from sandbox.config.merge import agent_ids, effective_agent
        from sandbox.runtime import lifecycle
        from sandbox.runtime.docker.backend import DockerBackend
        from sandbox.runtime.manager import SandboxManager
        from sandbox.tools.catalog import build_registry

        registry, problems = build_registry(state.config)
        data["skills"] = {
            "loaded": [n for n in registry.names() if registry.get(n).category == "skill"],
            "refused": [{"file": str(p.file), "reason": p.message} for p in problems],
        }
        resolver = state.resolver()
        data["agents"] = {}
        for agent_id in agent_ids(state.config):
            sandbox = effective_agent(state.config, agent_id).sandbox
            main_tools = resolver.resolve(Identity(agent_id, f"agent:{agent_id}:main")).allowed
            data["agents"][agent_id] = {"mode": sandbox.mode, "scope": sandbox.scope, "tools_main": sorted(main_tools)}
        # where the service keeps them: the shared store with state.url on PostgreSQL, else the journal
        source = _approvals(state)
        data["pending_approvals"] = [a.__dict__ for a in source.approvals("pending")]
        source.close()

        async def sandboxes() -> list[dict[str, Any]]:
            manager = SandboxManager(state.config, DockerBackend())
            try:
                return [
                    {"name": r.info.name, "agent": r.info.agent, "state": r.info.status, "config_match": r.config_match}
                    for r in await lifecycle.rows(manager)
                ]
            except Exception as exc:
                return [{"error": str(exc)}]
            finally:
                await manager.backend.aclose()

        data["sandboxes"] = anyio.run(sandboxes)
    journal.close()
    _emit(data, as_json, json.dumps(data, indent=2, default=str))
