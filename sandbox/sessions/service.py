"""Sub-agent sessions: spawn, what a session may see, its inbox, and the cascade when one closes.

The registry (sessions/registry.py) holds the lineage; the journal holds the calls. Visibility
never crosses tenants: every lookup is by the caller's tenant, and a key that resolves to
another tenant's agent is refused.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sandbox._log import logger
from sandbox.config.merge import EffectiveAgent
from sandbox.errors import ErrorCode, SandboxError, UsageError
from sandbox.journal.queries import MAX_PAGE
from sandbox.policy.groups import expand, expand_all
from sandbox.policy.resolver import Identity
from sandbox.policy.sessions import agent_of, key_problem, parse_session_key
from sandbox.runtime import shellwrap
from sandbox.sessions.child import REGISTRY_FILE, child_agent
from sandbox.sessions.registry import Child, Message, Registry
from sandbox.sessions.shared_registry import SharedRegistry

if TYPE_CHECKING:
    from sandbox.engine.orchestrator import Orchestrator, Session

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
MAX_MESSAGE_CHARS = 32_000
MAX_TASK_CHARS = 32_000
MAX_INBOX = 1_000  # messages one session's inbox holds
SHOWN_CHARS = 4_000  # of one message in sessions_history (the cut is marked)
LISTED_TASK_CHARS = 200
Listener = Callable[[str, dict[str, Any]], None]


class SessionsService:
    """Lineage, visibility, inboxes and cascades for one orchestrator."""

    def __init__(self, orch: Orchestrator) -> None:
        self._orch = orch
        self._registry: Registry | SharedRegistry | None = None
        self._listeners: list[Listener] = []

    # -- plumbing --------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The registry's database file."""
        return self._orch.config.state_dir / REGISTRY_FILE

    @property
    def registry(self) -> Registry | SharedRegistry:
        """The registry (opened, and made, on first use)."""
        if self._registry is None:
            self._registry = Registry(self.path)
        return self._registry

    def _existing(self) -> Registry | SharedRegistry | None:
        # nothing was ever spawned in this instance: no database, no lookups
        return self.registry if self._registry is not None or self.path.exists() else None

    def share_registry(self, registry: Registry | SharedRegistry | None) -> None:
        """Use the shared store's registry from now on (several replicas); None: the state dir's."""
        if self._registry is not None:
            self._registry.close()
        self._registry = registry

    async def keep_bounded(self, max_age_s: float | None, every_s: float) -> None:
        """Delete inbox messages and closed sessions' lineage older than `max_age_s` now and every
        `every_s` (the service's lifespan runs it; `journal.retention.max_age`, as for the calls):
        sub-agents spawned and closed for a month must not stay in the registry for good."""
        if max_age_s is None:
            return
        while True:
            registry = self._existing()
            if registry is not None:
                try:
                    gone = await anyio.to_thread.run_sync(registry.prune, time.time() - max_age_s)
                    if gone:
                        logger.bind(rows=gone).info("sessions_registry_pruned")
                except (SandboxError, OSError, sqlite3.Error) as exc:  # tried again next time
                    logger.bind(reason=str(exc)[:200]).warning("sessions_registry_prune_failed")
            await anyio.sleep(every_s)

    def shutdown(self) -> None:
        """Close the registry."""
        if self._registry is not None:
            self._registry.close()
            self._registry = None

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(kind, data)` on `session_spawned`, `session_message` and `session_closed`."""
        self._listeners.append(listener)

    def _emit(self, kind: str, **data: Any) -> None:
        # the log line (an operator ships it elsewhere) has the task's size, never its text: a
        # task is a model's words, secrets and all; listeners, in this process, get the text
        logged = {k: v for k, v in data.items() if k != "task"}
        if isinstance(data.get("task"), str):
            logged["task_chars"] = len(data["task"])
        logger.bind(**logged).info(kind)
        for listener in list(self._listeners):
            try:
                listener(kind, data)
            except Exception:  # a listener's bug must not undo what happened
                logger.bind(kind=kind).exception("session_listener_failed")

    def lineage(self, key: str) -> Child | None:
        """The lineage of a spawned session; None for any other."""
        registry = self._existing()
        return registry.child(key) if registry is not None else None

    def children(self, tenant: str, key: str) -> list[Child]:
        """Open children of a session (for the host application's model loops)."""
        registry = self._existing()
        return registry.children(tenant, key) if registry is not None else []

    def messages(self, tenant: str, key: str, after_id: int = 0) -> list[Message]:
        """A session's inbox, after `after_id`."""
        registry = self._existing()
        return registry.messages(tenant, key, after_id=after_id) if registry is not None else []

    def child_agent(self, agent: EffectiveAgent, child: Child) -> EffectiveAgent:
        """The agent as a spawned session runs it (see :func:`sandbox.sessions.child.child_agent`)."""
        return child_agent(self._orch.config, agent, child)

    # -- spawn -----------------------------------------------------------------------------

    async def spawn(
        self, caller: Session, call_id: str, *, task: str, name: str | None, agent: str | None, tools: list[str] | None
    ) -> dict[str, Any]:
        """Create `<caller>:subagent:<name>` and record its lineage before anything else exists."""
        section = self._orch.config.tools.subagents
        tenant = caller.agent.tenant
        target = self._target_agent(caller, agent)
        if len(task) > MAX_TASK_CHARS:
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS, f"the task is {len(task):,} characters; at most {MAX_TASK_CHARS:,}"
            )
        name = name or f"child-{secrets.token_hex(3)}"
        if not NAME.match(name) or name == "subagent":
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS, f"name {name!r}: use 1-32 of a-z 0-9 _ -, starting with a letter or digit"
            )
        rest = caller.policy.session.rest
        key = f"agent:{target.id}:{rest}:subagent:{name}"
        problem = key_problem(key)
        if problem:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"the child's key would be invalid: {problem}")
        depth = parse_session_key(key, target.id).spawn_depth
        if depth > section.max_spawn_depth:
            raise SandboxError(
                ErrorCode.PERMISSION_DENIED,
                f"a child here would be {depth} spawns deep; tools.subagents.max_spawn_depth is "
                f"{section.max_spawn_depth}",
            )
        narrow = self._narrowing(tools, caller.policy.allowed)
        self._refuse_weaker_sandbox(caller, target, key)
        view = section.parent_workspace
        source = await self._parent_source(caller) if view != "none" else ""
        child = Child(
            key,
            tenant,
            target.id,
            caller.key,
            depth,
            name,
            task,
            narrow,
            view,
            source,
            call_id,
            time.time(),
            "open",
            None,
        )
        await anyio.to_thread.run_sync(lambda: self.registry.add_child(child, max_children=section.max_children))
        self._emit("session_spawned", tenant=tenant, parent=caller.key, session=key, agent=target.id, task=task)
        return {
            "session": key,
            "agent": target.id,
            "parent": caller.key,
            "depth": depth,
            "task": task,
            "parent_workspace": f"/parent ({view})" if view != "none" else None,
            "tools": sorted(t.name for t in self._orch.session(key, agent=target.id).tools()),
            "note": "the host application runs the child's model loop; its sandbox is made on its first call",
        }

    def _target_agent(self, caller: Session, agent: str | None) -> EffectiveAgent:
        if agent is None or agent == caller.agent.id:
            return caller.agent
        section = self._orch.config.tools.subagents
        if agent not in section.allow_agents:
            raise SandboxError(
                ErrorCode.PERMISSION_DENIED,
                f"this session may spawn children of its own agent only; agent {agent!r} is not in "
                "tools.subagents.allow_agents",
            )
        try:
            target = self._orch.policy.agent(agent)
        except UsageError as exc:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, exc.message) from exc
        if target.tenant != caller.agent.tenant:
            raise SandboxError(ErrorCode.PERMISSION_DENIED, f"agent {agent!r} belongs to another tenant")
        return target

    def _refuse_weaker_sandbox(self, caller: Session, target: EffectiveAgent, key: str) -> None:
        """Another agent's child must not run looser than its parent: a sandboxed parent never
        gets an unsandboxed child, nor one with a network when it has none."""
        if target.id == caller.agent.id or not caller.sandboxed:
            return
        child = self._orch.policy.resolve(Identity(target.id, key))
        looser = []
        if not child.sandbox.sandboxed:
            looser.append("it would run on the host (its agent's sandbox mode)")
        elif caller.agent.sandbox.docker.network == "none" and target.sandbox.docker.network != "none":
            looser.append(f"it would have network {target.sandbox.docker.network!r} where this session has none")
        if looser:
            raise SandboxError(
                ErrorCode.PERMISSION_DENIED,
                f"agent {target.id!r} cannot run this session's child: {'; '.join(looser)}",
            )

    def _narrowing(self, tools: list[str] | None, parent_allowed: frozenset[str]) -> tuple[str, ...]:
        """The child's spawn layer: never more than the parent has now (its provider layers
        included, which the child's own resolution would not see), narrowed by `tools`."""
        if tools is None:
            return tuple(sorted(parent_allowed))
        if not tools:
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS, "tools must name at least one tool (omit it to keep the policy's tools)"
            )
        universe = self._orch.policy.universe
        unknown = [t for t in tools if not expand(t, universe)]
        if unknown:
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS,
                f"unknown tools {unknown}; name tools or groups this policy knows (e.g. exec, read, group:fs)",
            )
        kept = expand_all(tools, universe) & parent_allowed
        if not kept:
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS,
                f"none of {tools} is available to this session, so the child would have no tools",
            )
        return tuple(sorted(kept))

    async def _parent_source(self, caller: Session) -> str:
        """The host folder of the caller's workspace (made now, so the child can mount it)."""
        if not caller.sandboxed:
            workspace = caller.agent.workspace
            await anyio.to_thread.run_sync(lambda: workspace.mkdir(parents=True, exist_ok=True))
            return str(workspace)
        box = await caller.sandbox_required()  # its workspace exists once its sandbox does
        folder = box.spec.workspace.host_path
        if folder is None:
            raise SandboxError(
                ErrorCode.SANDBOX_UNAVAILABLE,
                "this session's workspace is a Docker volume (workspace_store: volume), which a child "
                "cannot be shown at /parent yet; spawn with tools.subagents.parent_workspace: none",
            )
        return str(folder)

    # -- what a session may see ------------------------------------------------------------

    def visible(self, caller: Session) -> dict[str, dict[str, Any]]:
        """key -> what is known of it, for every session `caller` may see (never another tenant's)."""
        tenant, agent = caller.agent.tenant, caller.agent.id
        registry = self._existing()
        journal = self._orch.journal
        seen: dict[str, dict[str, Any]] = {caller.key: {"relation": "self"}}
        whole_agent = caller.policy.session.is_main or self._orch.config.tools.subagents.visibility == "agent"
        if whole_agent:
            for key, last, calls in journal.sessions(tenant, agent) if journal else []:
                seen.setdefault(key, {"relation": "same agent"}).update(last_activity=last, calls=calls)
            for c in registry.of_agent(tenant, agent) if registry else []:
                if agent_of(c.parent) == agent:  # another agent's child is seen through its parent's tree
                    seen.setdefault(c.key, {"relation": "same agent"})
        for c in registry.descendants(tenant, caller.key, include_closed=True) if registry else []:
            seen[c.key] = {"relation": "child" if c.parent == caller.key else "descendant"}
        if registry is not None:
            for key, info in seen.items():
                row = registry.child(key)
                if row is None:
                    continue
                if row.tenant != tenant:  # a key can name another tenant's lineage row: never shown
                    info["hidden"] = True
                    continue
                info.update(parent=row.parent, depth=row.depth, status=row.status, task=row.task)
        return {k: v for k, v in seen.items() if not v.get("hidden")}

    def _visible_target(self, caller: Session, key: str) -> dict[str, Any]:
        info = self.visible(caller).get(key)
        if info is None:
            raise SandboxError(
                ErrorCode.PERMISSION_DENIED,
                f"session {key!r} is not visible to this session (it sees itself and the sessions it "
                "spawned; see tools.subagents.visibility)",
                session=key,
            )
        return info

    async def list_visible(self, caller: Session, limit: int) -> dict[str, Any]:
        """sessions_list."""
        seen = await anyio.to_thread.run_sync(self.visible, caller)
        rows = [{"session": k, "status": v.get("status", "open"), **v} for k, v in seen.items()]
        for row in rows:
            if isinstance(row.get("task"), str) and len(row["task"]) > LISTED_TASK_CHARS:
                row["task"] = (
                    row["task"][:LISTED_TASK_CHARS] + f" [... {len(row['task']) - LISTED_TASK_CHARS:,} chars cut]"
                )
        return {"sessions": rows[:limit], "total": len(rows)}

    async def history(self, caller: Session, key: str, limit: int) -> dict[str, Any]:
        """sessions_history: the session's calls (from the journal) and messages, oldest first."""
        info = await anyio.to_thread.run_sync(self._visible_target, caller, key)
        tenant = caller.agent.tenant
        items: list[dict[str, Any]] = []
        journal = self._orch.journal
        if journal is not None:
            # the tenant inside the query (its (tenant, session) index): a neighbour's session of the
            # same key never crowds this one's calls out of the page
            page = await anyio.to_thread.run_sync(
                lambda: journal.page(tenant=tenant, session=key, limit=min(20 * limit, MAX_PAGE))
            )
            calls: dict[str, dict[str, Any]] = {}
            for e in reversed(page.events):  # oldest first: a call's entry ends with its last stage
                entry = calls.setdefault(e.call_id, {"kind": "call", "call_id": e.call_id, "tool": e.tool, "ts": e.ts})
                entry["stage"] = e.stage
                if "code" in e.data:
                    entry["error"] = e.data["code"]
            items.extend(calls.values())
        registry = self._existing()
        recent = (
            await anyio.to_thread.run_sync(lambda: registry.messages(tenant, key, limit=limit, newest=True))
            if registry is not None
            else []
        )
        for m in recent:
            text = (
                m.text
                if len(m.text) <= SHOWN_CHARS
                else m.text[:SHOWN_CHARS] + f" [... {len(m.text) - SHOWN_CHARS:,} chars cut]"
            )
            items.append({"kind": "message", "id": m.id, "from": m.sender, "text": text, "ts": m.created_at})
        items.sort(key=lambda i: float(i["ts"]))
        return {"session": key, "task": info.get("task"), "items": items[-limit:], "total": len(items)}

    async def send(self, caller: Session, key: str, text: str) -> dict[str, Any]:
        """sessions_send: append to a visible session's inbox (durable)."""
        if len(text) > MAX_MESSAGE_CHARS:
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS, f"the message is {len(text):,} characters; at most {MAX_MESSAGE_CHARS:,}"
            )
        info = await anyio.to_thread.run_sync(self._visible_target, caller, key)
        if info.get("status") == "closed":
            raise SandboxError(ErrorCode.CONFLICT, f"session {key!r} was closed; nobody reads its inbox")
        tenant = caller.agent.tenant
        held = await anyio.to_thread.run_sync(lambda: self.registry.count_messages(tenant, key))
        if held >= MAX_INBOX:
            raise SandboxError(
                ErrorCode.QUOTA_EXCEEDED, f"session {key!r} already has {held:,} messages (at most {MAX_INBOX:,})"
            )
        msg = await anyio.to_thread.run_sync(lambda: self.registry.send(tenant, key, caller.key, text))
        self._emit("session_message", tenant=tenant, session=key, sender=caller.key, message_id=msg.id)
        return {"sent": True, "session": key, "message_id": msg.id}

    async def status(self, caller: Session) -> dict[str, Any]:
        """session_status: this session's sandbox, policy, limits and usage."""
        agent = caller.agent
        section = self._orch.config.tools.subagents
        sandbox: dict[str, Any] | None = None
        if caller.sandboxed:
            spec = self._orch.manager.spec_for(agent, caller.key)
            exists = await self._orch.backend.exists(spec.name)
            sandbox = {
                "name": spec.name,
                "exists": exists,
                "scope": agent.sandbox.scope,
                "image": spec.image,
                "workspace_access": agent.sandbox.workspace_access,
                "network": agent.sandbox.docker.network,
                "mounts": [{"container": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts],
            }
        child = caller.child
        registry = self._existing()
        open_children = len(registry.children(agent.tenant, caller.key)) if registry else 0
        return {
            "session": caller.key,
            "agent": agent.id,
            "tenant": agent.tenant,
            "sandboxed": caller.sandboxed,
            "sandbox": sandbox,
            "tools": sorted(t.name for t in caller.tools()),
            "parent": child.parent if child else None,
            "depth": child.depth if child else 0,
            "limits": {
                "max_children": section.max_children,
                "max_spawn_depth": section.max_spawn_depth,
                "workspace_quota": agent.sandbox.workspace_quota,
                "memory": agent.sandbox.docker.memory,
                "pids": agent.sandbox.docker.pids_limit,
            },
            "usage": {"open_children": open_children, "calls": await anyio.to_thread.run_sync(self._calls, caller)},
        }

    def _calls(self, caller: Session) -> int:
        journal = self._orch.journal
        if journal is None:
            return 0
        return journal.session_calls(caller.agent.tenant, caller.agent.id, caller.key)

    # -- cascade ---------------------------------------------------------------------------

    async def close_session(self, session: Session) -> list[str]:
        """Close `session` and every descendant (deepest first); return the keys closed.

        The cascade is marked in the registry first and unmarked last, so an orchestrator killed
        half-way finishes it in :meth:`finish_cascades`.
        """
        registry = self._existing()
        tenant = session.agent.tenant
        descendants = registry.descendants(tenant, session.key) if registry else []
        marked = registry is not None and (bool(descendants) or session.child is not None)
        if marked:
            assert registry is not None
            registry.begin_cascade(tenant, session.key, session.agent.id)
        closed = []
        while descendants:
            for d in reversed(descendants):
                await self._orch.session(d.key, agent=d.agent).release(reason=f"its ancestor {session.key} was closed")
                assert registry is not None
                registry.mark_closed(d.key)
                closed.append(d.key)
                self._emit("session_closed", tenant=tenant, session=d.key, by=session.key)
            # a spawn that passed its checks before the mark may have landed meanwhile
            assert registry is not None
            descendants = [
                d for d in registry.descendants(tenant, session.key, include_closed=True) if d.status == "open"
            ]
        await session.release(reason="the session was closed")
        if registry is not None and session.child is not None:
            registry.mark_closed(session.key)
            self._emit("session_closed", tenant=tenant, session=session.key, by=session.key)
        if marked:
            assert registry is not None
            registry.end_cascade(tenant, session.key)
        return [*closed, session.key]

    async def finish_cascades(self) -> list[str]:
        """After a restart: finish every cascade an orchestrator began and did not end."""
        registry = self._existing()
        if registry is None:
            return []
        done = []
        for _tenant, key, agent in registry.pending_cascades():
            done += await self.close_session(self._orch.session(key, agent=agent))
        return done


class BoundSessions:
    """:class:`~sandbox.tools.context.SessionsPort` for one call of one session."""

    def __init__(self, service: SessionsService, session: Session, call_id: str) -> None:
        self._service = service
        self._session = session
        self._call_id = call_id

    async def spawn(self, *, task: str, name: str | None, agent: str | None, tools: list[str] | None) -> dict[str, Any]:
        """See :meth:`SessionsService.spawn`."""
        return await self._service.spawn(self._session, self._call_id, task=task, name=name, agent=agent, tools=tools)

    async def list_sessions(self, *, limit: int) -> dict[str, Any]:
        """See :meth:`SessionsService.list_visible`."""
        return await self._service.list_visible(self._session, limit)

    async def history(self, *, session: str, limit: int) -> dict[str, Any]:
        """See :meth:`SessionsService.history`."""
        return await self._service.history(self._session, session, limit)

    async def send(self, *, session: str, text: str) -> dict[str, Any]:
        """See :meth:`SessionsService.send`."""
        return await self._service.send(self._session, session, text)

    async def status(self) -> dict[str, Any]:
        """See :meth:`SessionsService.status`."""
        return await self._service.status(self._session)


async def end_session_work(orch: Orchestrator, session: Session, reason: str) -> None:
    """What closing one session stops: its pending approvals (denied) and background processes."""
    journal = orch.journal
    if journal is not None:
        pending = await anyio.to_thread.run_sync(journal.approvals, "pending")
        for approval in (a for a in pending if a.session == session.key):
            with contextlib.suppress(SandboxError):  # decided meanwhile: that decision stands
                await anyio.to_thread.run_sync(journal.decide, approval.id, "denied", f"cancelled: {reason}")
    try:
        table = await session.process_table().all()
    except SandboxError:  # the shared store away: the sandbox's own timeouts still hold
        table = {}
    if table:
        shell = await session.shell(create=False)
        if shell is None:  # its sandbox is gone, and its processes with it
            return
        for proc_id in table:
            with contextlib.suppress(SandboxError, ValueError):
                await shell.kill(proc_id, "KILL")
                # its output, exit and pid files: on the sandbox's /tmp, which outlives the session
                # in agent and shared scope (a month of sessions filled it)
                await shell.run_argv(shellwrap.forget_argv(proc_id, shell.pid_dir))
    await _end_own_uid(session)


async def _end_own_uid(session: Session) -> None:
    """With a uid of its own in a shared container, anything else the session left running goes
    too: a detached process would hold the container's pids and CPU, and write to the shared
    workspace, after the session is over. Never fails the close (it is logged)."""
    if session.agent.sandbox.scope == "session":
        return  # its container goes with it, and all that runs there
    why = ""
    try:
        view = await session.own_uid_view()
        if view is None:
            return  # no uid of its own, or no sandbox running: nothing of it runs there
        if not await view.end_processes():
            why = "some survived every round"
    except (SandboxError, OSError, ValueError) as exc:
        why = getattr(exc, "message", None) or str(exc)
    if why:
        logger.bind(session=session.key).warning("session_processes_left", reason=why[:300])
