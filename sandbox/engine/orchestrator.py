"""The public entry point: an Orchestrator owns config, policy and runtime (a Session, in
engine/session.py, calls tools)."""

from __future__ import annotations

import sys
from collections import OrderedDict
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from sandbox._log import logger
from sandbox.config.merge import agent_ids, default_agent_id, effective_agent
from sandbox.config.models import Config
from sandbox.engine import handover, recovery
from sandbox.engine.approvals import ApprovalGate
from sandbox.engine.arguments import MAX_BYTES as MAX_ARGUMENT_BYTES
from sandbox.engine.executor import Engine
from sandbox.engine.handles import CallHandle, Calls
from sandbox.engine.hooks import Hooks
from sandbox.engine.limits import Limiter
from sandbox.engine.loops import JournalLoops, LoopDetector
from sandbox.engine.progress import ProgressBus
from sandbox.engine.session import Session
from sandbox.errors import ConfigError, ErrorCode, SandboxError, UsageError
from sandbox.journal.calls import JournalCalls
from sandbox.journal.store import Approval, Journal
from sandbox.policy.resolver import Identity, PolicyResolver
from sandbox.policy.sessions import agent_of
from sandbox.runtime.backends import backend_for
from sandbox.runtime.lifecycle import pause_idle
from sandbox.runtime.manager import SandboxManager
from sandbox.runtime.session_users import SharedUids
from sandbox.sessions.registry import Child, Message
from sandbox.sessions.service import SessionsService
from sandbox.state.protocol import ApprovalStore, CallStore, SessionRecords, SharedCalls, SharedEngineState
from sandbox.tools.builtin import BUILTIN_BY_NAME
from sandbox.tools.catalog import build_registry
from sandbox.tools.registry import ToolRegistry
from sandbox.tools.skills import SkillProblem

if TYPE_CHECKING:  # Docker is imported when a sandbox is first needed: host sessions never load it
    from sandbox.runtime.protocol import Backend, Browsers
    from sandbox.tools.search import SearchProvider


SESSION_HANDLES = 4096  # session handles kept for reuse, least recently used first out


class Orchestrator:
    """Decides which tools exist for a session and runs them in its sandbox.

    Args:
        config: a loaded config (see :func:`sandbox.load_config`).
        backend: the sandbox backend (default: the one `runtime.backend` names, Docker unless set).

    Use as `async with Orchestrator(config) as orch: session = orch.session(...)`.
    """

    def __init__(
        self,
        config: Config,
        backend: Backend | None = None,
        *,
        registry: ToolRegistry | None = None,
        progress: ProgressBus | None = None,
        hooks: Hooks | None = None,
        journal: Journal | bool | None = True,
        search_provider: SearchProvider | None = None,
    ) -> None:
        self.config = config
        # web_search exists only with a provider (sandbox/tools/search.py)
        self.search_provider = search_provider
        self._backend = backend
        self._manager: SandboxManager | None = None
        self._browsers: Browsers | None = None
        self._shared_calls: SharedCalls | None = None
        self.shared_uids: SharedUids | None = None  # session uids of the shared store (share_session_uids)
        self.shared_records: SessionRecords | None = None  # sessions' process tables there (idem)
        self._journal_calls: JournalCalls | None = None
        self.skill_problems: list[SkillProblem] = []
        if registry is None:
            registry, self.skill_problems = build_registry(config)
            for problem in self.skill_problems:
                logger.bind(file=str(problem.file), reason=problem.message).warning("skill_refused")
        self.registry = registry
        extra = tuple(name for name in self.registry.names() if name not in BUILTIN_BY_NAME)
        self.policy = PolicyResolver(config, extra_tools=extra)
        tenants = {agent.tenant for agent in config.agents.list} or {"default"}
        self.limiter = Limiter(config.limits, multi_tenant=len(tenants) > 1)
        for spec in (self.registry.get(n) for n in self.registry.names()):
            self.limiter.declare_tool(spec.name, spec.max_concurrency)
        self.progress = progress or ProgressBus()
        self.calls = Calls(lambda: self.call_store, self.progress)  # submitted calls (engine/handles.py)
        self.handover = (
            handover.Handover()
        )  # calls handed to the next orchestrator when this one stops (engine/handover.py)
        # spawned sessions: lineage, inboxes, cascades (its database is made on the first spawn)
        self.sessions = SessionsService(self)
        # Session handles by identity: a session's file states and host shell are made once, not
        # per call (a new handle per request cost the service about 0.4 ms a call)
        self._handles: OrderedDict[tuple[str, str, str | None, str | None, str | None], Session] = OrderedDict()
        # the journal is opened now: a state dir that cannot hold it fails loudly, before any call
        if journal is True:
            journal = Journal(config.state_dir / "journal.sqlite3")
        self.journal: Journal | None = journal or None
        if self.journal is None:
            _refuse_approvals_without_journal(config, self.registry)
        if hooks is None:
            hooks = Hooks()
            hooks.load_entry_points()  # plugins register theirs (entry point group agent_sandbox.hooks)
        self.hooks = hooks
        # the history lives in the journal, so separate processes (CLI calls) count together
        self.loops = LoopDetector(
            config.tools.loop_detection, store=JournalLoops(self.journal) if self.journal is not None else None
        )
        gate = ApprovalGate(config, self.journal, self.policy.universe) if self.journal is not None else None
        self.engine = Engine(
            self.registry,
            self.limiter,
            self.progress,
            config.results.max_chars,
            hooks=self.hooks,
            loops=self.loops,
            approvals=gate,
            journal=self.journal,
            # room for one write of tools.fs.max_write_bytes, JSON-escaped
            max_argument_bytes=max(MAX_ARGUMENT_BYTES, 2 * config.tools.fs.max_write_bytes + 64 * 1024),
            providers=self.providers(),
            handover=self.handover,
        )

    @property
    def backend(self) -> Backend:
        """The sandbox backend: the one given, else the one `runtime.backend` names (default Docker)."""
        if self._backend is None:
            self._backend = backend_for(self.config)
        return self._backend

    def providers(self) -> frozenset[str]:
        """The tools an application made possible here by giving their provider (web_search)."""
        return frozenset({"web_search"}) if self.search_provider is not None else frozenset()

    def browsers(self) -> Browsers:
        """The browser sandboxes (one manager, so one lock, per orchestrator).

        Raises:
            SandboxError: SANDBOX_UNAVAILABLE when the backend has no browser sandboxes.
        """
        browsers = self.browsers_if_any()
        if browsers is None:
            raise SandboxError(
                ErrorCode.SANDBOX_UNAVAILABLE,
                f"the {self.backend.name!r} backend has no browser sandboxes (docker and kubernetes have them)",
            )
        return browsers

    def browsers_if_any(self) -> Browsers | None:
        """The browser sandboxes, or None when this backend has none (nothing is started here)."""
        if self._browsers is None:
            self._browsers = self.backend.browsers(self.manager.instance)
        return self._browsers

    @property
    def manager(self) -> SandboxManager:
        """Sessions -> sandboxes (scopes, creation, reuse)."""
        if self._manager is None:
            self._manager = SandboxManager(self.config, self.backend)
            self._manager.journal = self.journal
        return self._manager

    async def __aenter__(self) -> Orchestrator:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def call(self, call_id: str) -> CallHandle:
        """The handle of a submitted (or keyed) call, by id: its status says whether it exists and
        whose it is (check its tenant before showing it to anyone)."""
        return self.calls.handle(call_id)

    async def aclose(self) -> None:
        """Stop submitted calls still running (recorded abandoned); release engine connections
        (sandboxes stay: the engine is the inventory)."""
        await self.calls.aclose()
        browser_tool = sys.modules.get("sandbox.tools.handlers.browser")
        if browser_tool is not None:  # its CDP driver, when the browser tool ran in this loop
            await browser_tool.close_drivers()
        if self._backend is not None:
            await self._backend.aclose()
        if self.journal is not None:
            # writes what is queued and joins the writer thread: off the event loop
            await anyio.to_thread.run_sync(self.journal.close)
        self.sessions.shutdown()

    async def keep_pools_filled(self) -> None:
        """Keep every agent's warm pool (`sandbox.pool.size`) filled until cancelled: start it in
        a task group of a long-lived application (the service does). Returns at once without pools."""
        pool = self.manager.pool
        if pool is not None and pool.pooled_agents():
            await pool.keep_filled()

    async def keep_idle_paused(self) -> None:
        """Pause sandboxes idle past their agent's `sandbox.idle_pause_s` until cancelled (the
        service runs it; runtime/lifecycle.py: pause_idle). Returns at once when no agent pauses,
        or the backend cannot (a cluster)."""
        every = [
            s.idle_pause_s
            for a in agent_ids(self.config)
            if (s := effective_agent(self.config, a).sandbox).idle_pause_s
        ]
        if not every or self.backend.freezer() is None:
            return
        interval = max(0.5, min(30.0, min(every) / 3))  # a sandbox is paused within a third of its time
        while True:
            await anyio.sleep(interval)
            try:
                await pause_idle(self.manager)
            except SandboxError as exc:  # the engine hiccuped: the next round tries again
                logger.bind(code=exc.code.value, error=exc.message[:200]).warning("idle_pause_failed")

    async def fill_pools(self) -> int:
        """Fill the warm pools once (and remove stale pool containers); how many were made."""
        pool = self.manager.pool
        return await pool.fill_once() if pool is not None else 0

    @property
    def call_store(self) -> CallStore | None:
        """Where call records (idempotency keys) live: the shared store while the service holds
        one, else the journal; None without a journal."""
        if self._shared_calls is not None:
            return self._shared_calls
        if self.journal is None:
            return None
        if self._journal_calls is None:
            self._journal_calls = JournalCalls(self.journal)
        return self._journal_calls

    def share_calls(self, store: SharedCalls | None) -> None:
        """Keep call records in the shared `store` from now on (None: in the journal again);
        unkeyed calls are recorded there too while they run (engine/once.py: call_tracked)."""
        self._shared_calls = store

    def share_session_uids(self, store: SharedEngineState | None) -> None:
        """Take session uids from the shared `store` from now on, claim warm-pool members and
        keep sessions' process tables and loop history there too (None: the state dir's registry,
        claim files, tables and journal): replicas on one engine never hand one uid, or one
        pooled container, to two sessions, a process started through one is polled through
        another, and loops spread over them are caught."""
        self.shared_uids = SharedUids(store) if store is not None else None
        self.shared_records = store
        if store is not None:  # a model repeating itself through several replicas is counted once
            self.loops.store = store
        elif self.journal is not None:
            self.loops.store = JournalLoops(self.journal)
        self.manager.shared_pool_claims = store

    @property
    def tracked_calls(self) -> SharedCalls | None:
        """The shared store that records unkeyed calls while they run; None without one."""
        return self._shared_calls

    @property
    def approval_store(self) -> ApprovalStore | None:
        """The shared store approvals live in while the service holds one; None: the journal."""
        gate = self.engine.approvals
        return gate.store if gate is not None else None

    def share_approvals(self, store: ApprovalStore | None) -> None:
        """Keep approvals in the shared `store` from now on (None: in the journal again)."""
        if self.engine.approvals is not None:
            self.engine.approvals.store = store

    def pending_approvals(self) -> list[Approval]:
        """Calls waiting for a human."""
        return self.journal.approvals("pending") if self.journal else []

    def approve(self, approval_id: str, reason: str = "") -> Approval:
        """Let a waiting call run.

        Raises:
            SandboxError: CONFLICT when the call was already decided (this decision is not
                recorded), INVALID_ARGUMENTS for an unknown id, INTERNAL without a journal.
        """
        return self._journal_for_approvals().decide(approval_id, "approved", reason)

    def deny(self, approval_id: str, reason: str = "") -> Approval:
        """Refuse a waiting call (the model gets APPROVAL_DENIED with the reason).

        Raises:
            SandboxError: as :meth:`approve`.
        """
        return self._journal_for_approvals().decide(approval_id, "denied", reason)

    def _journal_for_approvals(self) -> Journal:
        if self.journal is None:
            raise SandboxError(
                ErrorCode.INTERNAL, "approvals are decided through the journal; this orchestrator has none"
            )
        return self.journal

    async def note_durable(self, call_id: str, note: dict[str, Any]) -> None:
        """Where a durable call's command runs, in its record (engine/handover.py)."""
        if self.call_store is not None:
            await self.call_store.note_durable(call_id, note)

    async def recover(self, *, adopt: bool = True) -> list[dict[str, Any]]:
        """After a restart: settle every call the journal shows unfinished (see engine/recovery.py).

        `adopt`: take over durable calls whose owner is gone and wait for them here (a process
        that lives on: the service, an application); False in a one-shot process, which leaves
        them to the next that does (closing, it would only hand them over again)."""
        outcomes = await recovery.recover(self, adopt=adopt)
        if adopt:  # a shared store: the running records of replicas that are gone
            outcomes += await handover.adopt_orphans(self)
        for key in await self.sessions.finish_cascades():
            outcomes.append({"session": key, "now": "closed (a cascade the last orchestrator began)"})
        return outcomes

    def children(self, session: str, *, tenant: str) -> list[Child]:
        """The open children `session` spawned (the host application runs their model loops)."""
        return self.sessions.children(tenant, session)

    def messages(self, session: str, *, tenant: str, after_id: int = 0) -> list[Message]:
        """`session`'s inbox (what `sessions_send` delivered), after `after_id`."""
        return self.sessions.messages(tenant, session, after_id)

    def session(
        self,
        key: str,
        *,
        agent: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        sender: str | None = None,
    ) -> Session:
        """A handle on one session; cheap, nothing is created until a tool needs it.

        Raises:
            UsageError: unknown agent, or a key that belongs to another agent.
        """
        agent_id = agent or agent_of(key) or default_agent_id(self.config)
        child = self.sessions.lineage(key)
        if child is None and ":subagent:" in f":{key}:":
            # a sub-agent session exists only through sessions_spawn (its lineage, sandbox, cascade)
            raise UsageError(f"session {key!r} names a sub-agent that was never spawned; use sessions_spawn")
        handle_key = (agent_id, key, provider, model, sender)
        found = self._handles.get(handle_key)
        if found is not None and found.child == child:  # a child closed since is a new handle
            self._handles.move_to_end(handle_key)
            return found
        narrow = child.tools if child is not None else None
        policy = self.policy.resolve(Identity(agent_id, key, provider, model, narrow))
        made = Session(self, policy, sender, child)
        self._handles[handle_key] = made
        if len(self._handles) > SESSION_HANDLES:
            self._handles.popitem(last=False)  # a call still running keeps its own reference
        return made

    def forget_session(self, session: Session) -> None:
        """Drop every handle of a closed session, whatever its sender, provider or model (a later
        call starts afresh)."""
        agent_id, key = session.policy.identity.agent, session.key
        for handle_key in [k for k in self._handles if k[0] == agent_id and k[1] == key]:
            del self._handles[handle_key]


def _refuse_approvals_without_journal(config: Config, registry: ToolRegistry) -> None:
    """Approvals are decided through the journal: configured without one they would be dropped.

    Raises:
        ConfigError: naming what asks for approval.
    """
    rules = config.tools.approvals
    asking = [
        key
        for key, present in (
            ("tools.approvals.require", bool(rules.require)),
            ("tools.approvals.by_agent", any(rules.by_agent.values())),
            ("tools.approvals.by_sender", any(rules.by_sender.values())),
        )
        if present
    ]
    asking += [f"skill {n} (requires_approval)" for n in registry.names() if registry.get(n).requires_approval]
    if asking:
        raise ConfigError(
            [
                f"{', '.join(asking)}: approvals are configured but the orchestrator has no journal "
                "(journal=False); approvals are kept and decided in the journal, so without one they "
                "could not be honoured. Pass journal=True (the default) or a Journal."
            ]
        )


__all__ = ["Orchestrator", "Session"]
