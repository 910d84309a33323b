"""What the console's pages show, read from the orchestrator, its journal or the shared store,
and the engine: every value a model or a sandbox chose is escaped here for display (control and
format characters as visible `\\xNN` escapes, as `sandbox approvals show` prints them); the
templates escape markup on top (Jinja2's autoescape)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from sandbox.config.models import Config
from sandbox.engine.orchestrator import Orchestrator
from sandbox.escape import escape, escape_json_cut
from sandbox.journal.approvals import Approval
from sandbox.journal.queries import Event

EVENTS_SHOWN = 200
DATA_SHOWN = 2000  # characters of an event's data on a page (the journal reads at most a little more)
LINEAGE_SHOWN = 500  # sub-agents in the sessions tree: the newest
# what the CLI's serve command hands the console for the sandboxes page: the audit's findings and
# mount rows per target (sandbox/audit/run.py), or None on a backend the audit does not read
Auditor = Callable[[], tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]] | None]


def tenant_of_agent(config: Config) -> dict[str, str]:
    """Each configured agent's tenant."""
    return {a.id: a.tenant for a in config.agents.list if a.tenant}


ARGUMENTS_SHOWN = 16 * 1024  # characters of one approval's arguments in the list; its own page has them all


async def pending_approvals(
    o: Orchestrator, config: Config, *, only: str | None = None, cut: int | None = ARGUMENTS_SHOWN
) -> list[dict[str, Any]]:
    """Every tenant's pending approvals (or the one `only`), oldest first, ready to show: the
    arguments exact (never masked: the operator approves what will run), their text made in a
    worker thread (a tenant's megabyte command must not stall the event loop), and cut at `cut`
    characters with the full length said (the approval's own page shows them whole)."""
    store = o.approval_store
    journal = o.journal
    if store is not None:
        found = await store.approvals("pending", raw=True)
    elif journal is not None:
        found = await anyio.to_thread.run_sync(lambda: journal.approvals("pending", raw=True))
    else:
        found = []
    if only is not None:
        found = [a for a in found if a.id == only]
    tenants = tenant_of_agent(config)
    now = time.time()

    def shown(a: Approval) -> dict[str, Any]:
        text, more = _arguments(a, cut)
        return {
            "id": a.id,
            "tenant": tenants.get(a.agent, "?"),
            "agent": escape(a.agent),
            "session": escape(a.session),
            "tool": escape(a.tool),
            "arguments": text,
            "more": more,
            "waiting_s": max(0, int(now - a.created)),
            "call_id": a.call_id,
        }

    ordered = sorted(found, key=lambda a: a.created)
    return await anyio.to_thread.run_sync(lambda: [shown(a) for a in ordered])


_shown_arguments: dict[tuple[str, int | None], tuple[str, int]] = {}  # a pending approval's never change
SHOWN_KEPT = 256


def _arguments(a: Approval, cut: int | None) -> tuple[str, int]:
    """An approval's arguments as shown (cut before escaping; kept per approval: the list is
    refreshed every two seconds, and a tenant's 32 MiB of arguments would be read out each time)."""
    key = (a.id, cut)
    found = _shown_arguments.get(key)
    if found is None:
        found = escape_json_cut(a.arguments, cut if cut is not None else 1 << 62, indent=2)
        while len(_shown_arguments) >= SHOWN_KEPT:
            del _shown_arguments[next(iter(_shown_arguments))]
        _shown_arguments[key] = found
    return found


async def is_pending(o: Orchestrator, approval_id: str) -> bool:
    """Whether `approval_id` is a pending approval (one row read, nothing rendered)."""
    store = o.approval_store
    journal = o.journal
    if store is not None:
        found = await store.approval(approval_id)
    elif journal is not None:
        found = await anyio.to_thread.run_sync(lambda: journal.approval(approval_id))
    else:
        return False
    return found is not None and found.status == "pending"


@dataclass
class Node:
    """A session in the tree: its children are the sessions it spawned."""

    key: str
    tenant: str
    agent: str
    status: str = "seen"
    name: str = ""
    task: str = ""
    parent_view: str = ""
    children: list[Node] = field(default_factory=list)


async def session_tree(o: Orchestrator, config: Config) -> list[Node]:
    """Sessions as trees: the registry's lineage (spawned sub-agents under their parents), and the
    sessions seen in the newest events that spawned nothing."""
    nodes: dict[tuple[str, str], Node] = {}
    parents: dict[tuple[str, str], tuple[str, str]] = {}
    registry = o.sessions._existing()  # read-only: None when nothing was ever spawned
    if registry is not None:
        lineage = []
        for agent in config.agents.list:
            lineage += await anyio.to_thread.run_sync(registry.of_agent, agent.tenant or "", agent.id)
        lineage.sort(key=lambda c: (c.status != "open", -c.created_at))  # open ones, then the newest
        for child in lineage[:LINEAGE_SHOWN]:
            me = (child.tenant, child.key)
            nodes[me] = Node(
                    escape(child.key), child.tenant, escape(child.agent), child.status, escape(child.name),
                    escape(child.task[:300]), child.parent_view,
                )  # fmt: skip
            parents[me] = (child.tenant, child.parent)
    for event in await recent_events(o, None, limit=EVENTS_SHOWN):
        me = (event.tenant, event.session)
        if me not in nodes and event.session:
            nodes[me] = Node(escape(event.session), event.tenant, escape(event.agent))
    roots: list[Node] = []
    for me in list(nodes):
        parent = parents.get(me)
        if parent is not None and parent not in nodes:
            nodes[parent] = Node(escape(parent[1]), parent[0], "")
            roots.append(nodes[parent])
    for me, node in nodes.items():
        parent = parents.get(me)
        (nodes[parent].children if parent is not None else roots).append(node)
    return sorted({id(r): r for r in roots}.values(), key=lambda n: (n.tenant, n.key))


async def recent_events(
    o: Orchestrator, store: Any, *, session: str | None = None, tenant: str | None = None, tool: str | None = None,
    limit: int = EVENTS_SHOWN,
) -> list[Event]:  # fmt: skip
    """The newest events (every replica's with a shared store), newest first."""
    query: dict[str, Any] = {"tenant": tenant, "session": session, "tool": tool, "limit": limit}
    if store is not None:  # shipped events' data is at most 64 KiB already
        page = await store.events_page(**query)
    elif o.journal is not None:
        journal = o.journal
        # a page never loads an event's megabytes: data past what is shown comes as a note of its size
        page = await anyio.to_thread.run_sync(lambda: journal.page(**query, max_data=DATA_SHOWN * 2))
    else:
        return []
    return list(page.events)


def shown_event(event: Event) -> dict[str, Any]:
    """One event, ready to show (its data cut at 2,000 characters before it is escaped)."""
    return {
        "at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.ts)),
        "tenant": event.tenant,
        "session": escape(event.session),
        "tool": escape(event.tool),
        "stage": escape(event.stage),
        "duration_ms": f"{event.duration_ms:.0f}" if event.duration_ms is not None else "",
        "data": escape_json_cut(event.data, DATA_SHOWN)[0],
        "trace": event.trace_id,
    }


class CachedAudit:
    """The audit for the sandboxes page: one run at a time, its result kept `keep_s` (a full audit
    reads the engine and the journal: it must not run once per page load)."""

    def __init__(self, auditor: Auditor, keep_s: float = 30.0) -> None:
        self.auditor = auditor
        self.keep_s = keep_s
        self._lock = anyio.Lock()
        self._result: tuple[float, Any] | None = None

    async def __call__(self) -> Any:
        async with self._lock:
            if self._result is None or anyio.current_time() - self._result[0] > self.keep_s:
                self._result = (anyio.current_time(), await anyio.to_thread.run_sync(self.auditor))
            return self._result[1]


async def sandboxes(o: Orchestrator, audit_of: CachedAudit | None) -> tuple[list[dict[str, Any]], str]:
    """This orchestrator's sandboxes with their mounts and audit findings, and a note (why the
    audit is absent, when it is)."""
    listed = await o.backend.list(instance=o.manager.instance)
    audit = await audit_of() if audit_of is not None else None
    findings, mounts = audit if audit is not None else ([], {})
    rows = []
    for s in sorted(listed, key=lambda s: (s.tenant or "", s.name)):
        # the audit names a container `container NAME` or `container NAME (users, kind)`
        targets = {t for t in [*mounts, *(f.get("target", "") for f in findings)] if _names(t, s.name)}
        rows.append(
            {
                "name": escape(s.name),
                "tenant": s.tenant or "",
                "agent": escape(s.agent or ""),
                "scope": escape(s.scope),
                "session": escape(s.session or s.scope_key),
                "status": s.status,
                "mounts": [m for t in sorted(targets) for m in mounts.get(t, [])],
                "findings": [f for f in findings if f.get("target") in targets],
            }
        )
    note = "" if audit is not None else "the audit reads the Docker engine; this backend has none"
    return rows, note


def _names(target: str, name: str) -> bool:
    return target == f"container {name}" or target.startswith(f"container {name} (")
