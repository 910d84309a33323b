"""A Session: one agent's session key, its policy, and the tool calls made in it (files, shell, sandbox)."""

from __future__ import annotations

import contextlib
import shutil
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import anyio.to_thread

from sandbox._log import logger
from sandbox.config.binds import CONTAINER_WORKDIR
from sandbox.config.merge import EffectiveAgent
from sandbox.engine import spill
from sandbox.engine.batch import BatchCall, BatchResult, run_batch
from sandbox.engine.call import tool_name
from sandbox.engine.context import TaskContext
from sandbox.engine.executor import execute
from sandbox.engine.handles import CallHandle, submit_call
from sandbox.engine.once import MAX_BATCH_KEY, Ask, call_once, call_tracked, key_problem, recorded
from sandbox.errors import ErrorCode, SandboxError, unrecorded
from sandbox.fs.locks import lock_dir
from sandbox.fs.quota import WorkspaceQuota, parse_size
from sandbox.fs.states import FileStates, SeenFiles, SharedFileStates
from sandbox.fs.workspace import Root, WorkspaceFiles
from sandbox.journal.retention import parse_age
from sandbox.policy.resolver import ResolvedPolicy
from sandbox.preview.closed import mark_closed
from sandbox.runtime.backends import agent_files, host_shell
from sandbox.runtime.naming import short_hash, slug, tenant_scope
from sandbox.runtime.protocol import AgentChannel, Sandbox, Shell
from sandbox.runtime.session_users import (
    SessionShell,
    SessionUser,
    known_user,
    own_uid,
    session_shell,
    still_held,
    uid_scope,
)
from sandbox.runtime.spec import EGRESS_NETWORK, tenant_workspaces
from sandbox.sessions.registry import Child
from sandbox.sessions.service import BoundSessions, end_session_work
from sandbox.tools.availability import offered
from sandbox.tools.context import ToolContext
from sandbox.tools.process_table import FileProcessTable, ProcessTable, SharedProcessTable
from sandbox.tools.spec import ErrorInfo, ToolResult, ToolSpec

if TYPE_CHECKING:  # Docker is imported when a sandbox is first needed: host sessions never load it
    from sandbox.engine.orchestrator import Orchestrator
    from sandbox.runtime.protocol import BrowserEndpoint

# tool categories that work host-side (files, memory, sessions): a call of theirs sends nothing
# through an egress proxy, so nothing is collected after it
HOST_SIDE_CATEGORIES = frozenset({"file", "memory", "session"})


class Session:
    """One agent session: the tools it may see, and calls to them."""

    def __init__(
        self, orchestrator: Orchestrator, policy: ResolvedPolicy, sender: str | None, child: Child | None = None
    ) -> None:
        self._orch = orchestrator
        self.policy = policy
        self.sender = sender
        self.child = child  # the lineage of a spawned session (None for any other)
        self._agent = orchestrator.sessions.child_agent(policy.agent, child) if child else policy.agent
        self._files: WorkspaceFiles | None = None
        self._host_shell: Shell | None = None
        # this session's uid in each shared container it used (a uid is never given to another)
        self._session_users: dict[str, SessionUser] = {}

    @property
    def key(self) -> str:
        """The full session key."""
        return self.policy.session.raw

    @property
    def agent(self) -> EffectiveAgent:
        """The merged agent config (for a spawned session: its own sandbox, its parent's at /parent)."""
        return self._agent

    @property
    def sandboxed(self) -> bool:
        """Whether tools run in a sandbox for this session."""
        return self.policy.sandbox.sandboxed

    @property
    def state_dir(self) -> Path:
        """This session's folder in the orchestrator's state dir."""
        # the tenant is part of the name, and a 128-bit hash of the full key keeps apart keys
        # that one slug would merge (case, punctuation); the slug is only for people
        identity = tenant_scope(self.agent.tenant, self.key)
        return self._orch.config.state_dir / "sessions" / f"{slug(self.key, 40)}-{short_hash(identity, 32)}"

    def tools(self) -> list[ToolSpec]:
        """The tools the model may see (allowed by policy and runnable here)."""
        registry = self._orch.registry
        here = offered(registry, self.policy, self._orch.providers())
        return [registry.get(n) for n in registry.names() if n in here]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """name, description and JSON schema of each tool in :meth:`tools`."""
        return [{"name": s.name, "description": s.description, "parameters": s.json_schema()} for s in self.tools()]

    async def call(
        self,
        name: str,
        arguments: Any = None,
        *,
        trace_id: str | None = None,
        idempotency_key: str | None = None,
        approved: str | None = None,
    ) -> ToolResult:
        """Run one tool call; every failure comes back as a ToolResult with an error code.

        With `idempotency_key`, the call runs once for that key (in this tenant, for
        `journal.idempotency_ttl`): a repeat returns the first call's result (engine/once.py).
        With `approved` (a reason), a call that needs approval is approved by the caller itself,
        who asked a human first (an agent framework's pause, sandbox/adapters/): it is journaled
        approved with that reason and does not wait. See :meth:`approval_required`.
        """
        run = partial(self._execute, name, arguments, trace_id=trace_id, approved=approved)
        if idempotency_key is None:
            tracked = self._orch.tracked_calls
            if tracked is None:
                return await run()
            return await call_tracked(tracked, self.ask(name, arguments, None), run)
        ask = self.ask(name, arguments, idempotency_key)
        return await call_once(self._orch.call_store, ask, run, kept=self._orch.handover.kept)

    async def submit(
        self,
        name: str,
        arguments: Any = None,
        *,
        idempotency_key: str | None = None,
        trace_id: str | None = None,
        guard: AbstractAsyncContextManager[Any] | None = None,
        approved: str | None = None,
    ) -> CallHandle:
        """Start a call that runs on its own (engine/handles.py): its handle, at once. With a key
        already held by the same call, that call's handle; nothing new runs. `guard` is held
        while the call runs (the service's admission).

        Raises:
            SandboxError: INVALID_ARGUMENTS for a malformed key, a key used for another call, or
                an orchestrator without a journal.
        """
        run = partial(self._execute, name, arguments, trace_id=trace_id, approved=approved)
        ask = self.ask(name, arguments, idempotency_key)
        return await submit_call(self._orch.calls, ask, run, guard, kept=self._orch.handover.kept)

    def approval_required(self, name: str, arguments: Any = None) -> bool:
        """Whether a call of `name` with `arguments` would wait for a human (tools.approvals, the
        tool's own flag): what an agent framework asks before it pauses for its own approval."""
        gate = self._orch.engine.approvals
        wanted = tool_name(name)
        if gate is None or wanted not in self._orch.registry:
            return False
        params = arguments if isinstance(arguments, dict) else {}
        return gate.required(self._orch.registry.get(wanted), self.agent.id, self.sender, params)

    def ask(self, name: str, arguments: Any, key: str | None) -> Ask:
        """What a call record of this session is made of (engine/once.py)."""
        return Ask(
            tool=tool_name(name),
            arguments=arguments,
            tenant=self.agent.tenant,
            agent=self.agent.id,
            session=self.key,
            keep_s=parse_age(self._orch.config.journal.idempotency_ttl) or 86400.0,
            key=key,
        )

    async def call_many(
        self,
        calls: list[BatchCall],
        *,
        mode: Literal["parallel", "sequential"] = "parallel",
        idempotency_key: str | None = None,
    ) -> BatchResult:
        """Run several calls; see :func:`sandbox.engine.batch.run_batch`. With `idempotency_key`
        (at most 190 characters) the n-th call runs once under `key#n`: a repeat of the batch runs
        nothing that ran and gets the same results.

        Raises:
            SandboxError: INVALID_ARGUMENTS for a bad batch or a malformed key.
        """
        if idempotency_key is None:
            return await run_batch(self.call, calls, mode=mode, refuse=self._refuse)
        if (problem := key_problem(idempotency_key, room=MAX_BATCH_KEY)) is not None:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, problem, idempotency_key=idempotency_key[:MAX_BATCH_KEY])

        async def keyed(name: str, arguments: Any, index: int) -> ToolResult:
            return await self.call(name, arguments, idempotency_key=f"{idempotency_key}#{index}")

        return await run_batch(self.call, calls, mode=mode, refuse=self._refuse, keyed=keyed)

    async def _refuse(self, name: str, arguments: Any, error: SandboxError) -> ToolResult:
        """Journal a call that is not run (skipped or refused in a batch) and return its result."""
        return await self._execute(name, arguments, refused=error)

    async def _run(
        self,
        name: str,
        arguments: Any,
        trace_id: str | None,
        refused: SandboxError | None,
        call_id: str | None,
        approved: str | None = None,
    ) -> ToolResult:
        return await execute(
            self._orch.engine,
            name=name,
            arguments=arguments,
            policy=self.policy,
            make_context=self._context,
            spill=self._spill,
            tenant=self.agent.tenant,
            sender=self.sender,
            trace_id=trace_id,
            refused=refused,
            call_id=call_id,
            approved=approved,
        )

    def in_use(self) -> contextlib.AbstractContextManager[None]:
        """Mark the session's sandbox used while a call runs, so it is not paused as idle
        (nothing for an unsandboxed one)."""
        if not self.sandboxed:
            return contextlib.nullcontext()
        try:
            manager = self._orch.manager
            name = manager.spec_for(self.agent, self.key).name
        except SandboxError:  # no backend to be had: the call itself says why, as its result
            return contextlib.nullcontext()
        return manager.using(name)

    async def _execute(
        self,
        name: str,
        arguments: Any,
        *,
        trace_id: str | None = None,
        refused: SandboxError | None = None,
        call_id: str | None = None,
        approved: str | None = None,
    ) -> ToolResult:
        # a sandbox a call uses is never paused under it (sandbox.idle_pause_s)
        with self.in_use():
            result = await self._run(name, arguments, trace_id, refused, call_id, approved)
        egress = self.sandboxed and self.agent.sandbox.docker.network == EGRESS_NETWORK
        registry = self._orch.registry
        ran_inside = result.tool in registry and registry.get(result.tool).category not in HOST_SIDE_CATEGORIES
        if refused is None and egress and ran_inside:
            # what the call fetched, in the journal beside it (`sandbox logs`): the sandbox's proxy,
            # and the browser's when the call drove it
            manager = self._orch.manager
            await manager.collect_egress(manager.spec_for(self.agent, self.key).name)
            if result.tool == "browser":
                with contextlib.suppress(SandboxError):  # no docker backend: no browser, no proxy
                    await manager.collect_egress(self._orch.browsers().name_for(self.agent, self.key))
        return await self._settled(result)

    async def _settled(self, result: ToolResult) -> ToolResult:
        # a call's record is complete when its caller sees the result (the last stages and its
        # loop history were queued); waiting yields the loop, so concurrent calls share a commit
        journal = self._orch.journal
        if journal is None:
            return result
        registry = self._orch.registry
        if not (result.tool in registry and registry.get(result.tool).read_only):
            await journal.settle(result.call_id)
            return result
        # a call that only read waited for no commit before it ran (it protects nothing); what it
        # read reaches the caller only once its record is on disk, else the caller gets why not
        try:
            await journal.commit(result.call_id)
        except SandboxError as exc:
            logger.bind(code=exc.code.value, reason=exc.message[:500]).error("tool_call_not_journaled")
            error = unrecorded(exc)
            info = ErrorInfo(code=error.code.value, message=error.message, retryable=error.retryable)
            return result.model_copy(update={"ok": False, "output": None, "error": info})
        return result

    async def reset_loops(self) -> None:
        """Clear this session's loop history and its circuit breaker (in every process)."""
        await self._orch.loops.reset(self.agent.tenant, self.key)

    async def close(self) -> list[str]:
        """End the session and every session it spawned (deepest first); return the keys closed.

        For each: pending approvals are denied, background processes killed (with session users,
        every process of the session's uid in the container, detached or not), a session-scoped
        sandbox is removed (agent and shared ones stay). What the orchestrator holds in memory for
        the session goes too (its cached policy, its in-memory loop history), so a service that
        opens and closes sessions for weeks stays flat.
        """
        return await self._orch.sessions.close_session(self)

    async def release(self, *, reason: str) -> None:
        """Close this session alone (see :meth:`close`); `reason` goes on its cancelled approvals."""
        await end_session_work(self._orch, self, reason)
        # its record of files seen and of processes started: over once its processes are (and
        # before a new handle of its key is made: that one's records start anew)
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(self.state_dir, ignore_errors=True))
        if self.agent.sandbox.preview.ports:  # its preview links end with it, also where its sandbox stays
            await anyio.to_thread.run_sync(mark_closed, self._orch.config.state_dir, self.agent.tenant, self.key)
        if self.sandboxed:
            await self._orch.manager.close_session(self.agent, self.key)
            await self._close_browser()
        self._orch.policy.forget(self.policy.identity)
        await self._orch.loops.forget(self.agent.tenant, self.key)
        self._orch.forget_session(self)
        self._files = None
        self._host_shell = None
        self._session_users.clear()

    @overload
    async def shell(self, *, create: Literal[True] = True) -> Shell: ...

    @overload
    async def shell(self, *, create: bool) -> Shell | None: ...

    async def shell(self, *, create: bool = True) -> Shell | None:
        """The Shell this session's tools use (its sandbox, or the host); None if absent and not created."""
        if not self.sandboxed:
            env = self.agent.sandbox.docker.env
            return host_shell(self.agent.workspace, self._orch.config.state_dir / "host-procs", env=env)
        if not create:
            spec = self._orch.manager.spec_for(self.agent, self.key)
            if not await self._orch.backend.exists(spec.name):
                return None
        return await self._sandbox_shell()

    async def running_sandbox(self) -> Sandbox | SessionShell | None:
        """The session's sandbox as its own user sees it, when one runs (never made here: a
        preview, api/preview_routes.py, starts nothing)."""
        if not self.sandboxed:
            return None
        box = await self._orch.manager.live(self.agent, self.key)
        return None if box is None else await self._sandbox_shell(box)

    async def _sandbox_shell(self, box: Sandbox | None = None) -> Sandbox | SessionShell:
        """The sandbox as this session's commands see it: as its own uid where sessions share it."""
        box = box or await self._orch.manager.sandbox_for(self.agent, self.key)
        if not box.spec.session_users:
            return box  # no thread hop per call for what needs no file
        shared = self._orch.shared_uids
        if shared is not None:  # replicas agree on each session's uid
            return SessionShell(box, await shared.user(box.spec, self.key))
        scope = uid_scope(box.spec)
        registry = self._orch.config.state_dir / "session-users"
        user = self._session_users.get(scope)
        if user is not None and not still_held(registry, box.spec, self.key, user):
            user = None  # the registry changed under us (removed by hand): allocate again
        if user is None:
            shell = await anyio.to_thread.run_sync(session_shell, box, registry, self.key)
            if not isinstance(shell, SessionShell):  # cannot be: the spec asks for session users
                return shell
            user = self._session_users[scope] = shell.session_user
        return SessionShell(box, user)

    async def own_uid_view(self) -> SessionShell | None:
        """This session's own-uid view of its running sandbox, for closing it: None when it has
        no uid of its own there (no session users, no sandbox running, or it never ran in it).
        Nothing is made, started or allocated here."""
        if not self.sandboxed:
            return None
        spec = self._orch.manager.spec_for(self.agent, self.key)  # no engine call
        if not spec.session_users or own_uid(spec) is None:
            return None
        # the registry, not a cached uid: one removed by hand may have given it to another
        user = await known_user(spec, self.key, self._orch.config.state_dir / "session-users", self._orch.shared_uids)
        if user is None:
            return None  # it never ran there: nothing is woken, started or allocated
        box = await self._orch.manager.live(self.agent, self.key)
        return SessionShell(box, user) if box is not None else None

    async def sandbox(self) -> Sandbox | None:
        """The live sandbox of this session (created on first use); None when not sandboxed."""
        if not self.sandboxed:
            return None
        return await self._orch.manager.sandbox_for(self.agent, self.key)

    async def sandbox_required(self) -> Sandbox:
        """:meth:`sandbox` where the caller knows the session is sandboxed.

        Raises:
            SandboxError: SANDBOX_UNAVAILABLE when it is not (sandbox mode off).
        """
        box = await self.sandbox()
        if box is None:
            raise SandboxError(ErrorCode.SANDBOX_UNAVAILABLE, f"session {self.key} has no sandbox (sandbox mode off)")
        return box

    async def _close_browser(self) -> None:
        """The session's own browser sandbox goes with it (agent- and shared-scope ones stay)."""
        browsers = self._orch.browsers_if_any() if self.agent.sandbox.scope == "session" else None
        if browsers is None:
            return
        await browsers.close_session(self.agent, self.key, before=self._orch.manager.collect_egress)

    async def browser(self) -> BrowserEndpoint:
        """Start (or find) this session's browser sandbox; only when policy and config allow it."""
        return await self._orch.browsers().ensure(
            self.agent, self.key, browser_allowed="browser" in self.policy.allowed
        )

    async def tool_context(self, task: TaskContext) -> ToolContext:
        """What a tool handler of `task` gets in this session (its sandbox made when missing)."""
        return await self._context(task)

    async def _context(self, task: TaskContext) -> ToolContext:
        registry = self._orch.registry
        reads_only = task.tool in registry and registry.get(task.tool).read_only
        if self._orch.journal is not None and not reads_only:
            # the handler runs next: the call's stages must be durable first (INTERNAL if not); a
            # call that only reads protects nothing by waiting (its stages go with its end)
            await self._orch.journal.commit(task.call_id)
        if self.child is not None:
            current = await anyio.to_thread.run_sync(self._orch.sessions.lineage, self.key)
            if current is not None and current.status == "closed":
                raise SandboxError(
                    ErrorCode.CONFLICT,
                    f"session {self.key} was closed (it or its parent ended); nothing runs in it any more",
                )
        config = self._orch.config
        if self.sandboxed:
            box = await self._sandbox_shell()
            shell: Shell = box
            workdir = CONTAINER_WORKDIR
            if self._files is None:
                spec = box.spec
                roots = [
                    Root(
                        m.target,
                        Path(m.source),
                        m.read_only,
                        f"the workspace (workspace_access {spec.workspace_access})"
                        if i == 0
                        else f"the bind {m.target}",
                    )
                    for i, m in enumerate(spec.mounts)
                ]
                uid, _, gid = spec.user.partition(":")
                owner = (int(uid), int(gid or uid)) if uid.isdigit() else None
                if spec.workspace.host_path is None:  # a volume, or a cluster's: only the agent reaches it
                    self._files = await self._volume_files(box, roots, group_shared=spec.session_users)
                else:
                    self._files = self._make_files(roots, owner, group_shared=spec.session_users)
        else:
            workspace = self.agent.workspace
            if not workspace.is_dir():  # made on first use, and again if it was removed since
                await anyio.to_thread.run_sync(lambda: workspace.mkdir(parents=True, exist_ok=True))
            if self._host_shell is None:
                self._host_shell = host_shell(
                    workspace, config.state_dir / "host-procs", env=self.agent.sandbox.docker.env
                )
            shell = self._host_shell
            workdir = str(workspace)
            if self._files is None:
                self._files = self._make_files([Root(str(workspace), workspace, False, "the workspace")], None)
        tool_ctx = ToolContext(
            call_id=task.call_id,
            trace_id=task.trace_id,
            config=config,
            agent=self.agent,
            session=self.key,
            sandboxed=self.sandboxed,
            shell=shell,
            files=self._files,
            workdir=workdir,
            state_dir=self.state_dir,
            processes=self.process_table(),
        )
        tool_ctx.publish = partial(self._spill, tool_ctx)
        tool_ctx.durable = recorded.get() == task.call_id
        tool_ctx.handed_over = partial(self._orch.handover.kept, task.call_id)
        tool_ctx.durable_running = partial(self._orch.handover.track, task.call_id)
        tool_ctx.record_durable = partial(self._orch.note_durable, task.call_id)
        if self._orch.journal is not None:
            tool_ctx.sessions = BoundSessions(self._orch.sessions, self, task.call_id)
        if self.sandboxed:
            tool_ctx.browser = _SessionBrowser(self)
        tool_ctx.search = self._orch.search_provider
        return tool_ctx

    def file_states(self) -> SeenFiles:
        """What this session last saw of each file: in the shared store while the service holds
        one (an edit through any replica knows what it read through another), else its state dir."""
        shared = self._orch.shared_records
        if shared is not None:
            return SharedFileStates(shared, self.agent.tenant, self.key)
        return FileStates(self.state_dir / "file-states.json")

    def process_table(self) -> ProcessTable:
        """This session's background processes: in the shared store while the service holds
        one (every replica polls them), else in its state dir."""
        shared = self._orch.shared_records
        if shared is not None:
            return SharedProcessTable(shared, self.agent.tenant, self.key)
        return FileProcessTable(self.state_dir)

    def _make_files(
        self, roots: list[Root], owner: tuple[int, int] | None, *, group_shared: bool = False
    ) -> WorkspaceFiles:
        config = self._orch.config
        states = self.file_states()
        quota = None
        if self.sandboxed and roots:  # on the host (mode off) commands can write anywhere anyway
            limit = parse_size(self.agent.sandbox.workspace_quota)
            key = f"{self.agent.key_path}.sandbox.workspace_quota"
            quota = WorkspaceQuota([roots[0].host], limit, key, outer=self._tenant_quota())
        return WorkspaceFiles(
            roots, config.tools.fs, states, lock_dir(config.state_dir), owner, quota, group_shared=group_shared
        )

    async def _volume_files(
        self, box: Sandbox | SessionShell, roots: list[Root], *, group_shared: bool
    ) -> WorkspaceFiles:
        """The file tools of a workspace on a Docker volume: through the sandbox's agent
        (runtime/agent/files.py). Its quota is measured host-side, on the volume's folder, when the
        engine keeps it on this host (never by asking the agent: the sandbox could lie)."""

        async def link() -> AgentChannel:
            shell = await self._sandbox_shell()
            try:
                found = await shell.agent_link()
            except SandboxError as exc:
                raise SandboxError(
                    ErrorCode.SANDBOX_UNAVAILABLE,
                    "this workspace is not on this host (a Docker volume, or a cluster's), reached only "
                    f"through the sandbox's resident agent: {exc.message}",
                ) from exc
            if found is None:  # a backend without resident agents
                raise SandboxError(ErrorCode.SANDBOX_UNAVAILABLE, "this backend has no resident agents")
            return found

        config = self._orch.config
        states = self.file_states()
        quota = None
        limit = parse_size(self.agent.sandbox.workspace_quota)
        folder = await box.volume_folder() if limit else None
        if folder is not None:  # a local engine: the volume's folder is on this host
            key = f"{self.agent.key_path}.sandbox.workspace_quota"
            quota = WorkspaceQuota([folder], limit, key, label="the workspace volume")
        return agent_files(
            link, roots, config.tools.fs, states, lock_dir(config.state_dir), quota, group_shared=group_shared
        )

    def _tenant_quota(self) -> WorkspaceQuota | None:
        config = self._orch.config
        for index, tenant in enumerate(config.tenants):
            if tenant.id == self.agent.tenant and (limit := parse_size(tenant.quotas.max_workspace_bytes)):
                folders = tenant_workspaces(config, tenant.id)
                key = f"tenants[{index}].quotas.max_workspace_bytes"
                return WorkspaceQuota(folders, limit, key, label=f"the workspaces of tenant {tenant.id!r}")
        return None

    async def _spill(self, ctx: ToolContext, text: str | Path) -> str | None:
        """Save a full output in the workspace; its workspace-relative path (engine/spill.py).
        Raises on failure (a read-only or volume workspace keeps none); the engine turns that
        into a warning on the result."""
        return await spill.publish(ctx, text)


class _SessionBrowser:
    """The browser tool's port: the session's browser sandbox, started on first use."""

    def __init__(self, session: Session) -> None:
        self._session = session

    async def cdp_url(self) -> str:
        return (await self._session.browser()).cdp_url
