"""Sessions -> sandboxes: scopes, one creation per scope key, drift, adoption, cleanup."""

from __future__ import annotations

import builtins
import inspect
import os
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

import anyio

from sandbox._log import logger
from sandbox.config.merge import EffectiveAgent, effective_agent
from sandbox.config.models import Config
from sandbox.errors import SandboxUnavailable
from sandbox.journal.owners import owner_alive, owner_here
from sandbox.runtime import link_folders
from sandbox.runtime.bounded import MAX_REMEMBERED, drop_if_idle, remember
from sandbox.runtime.last_used import LastUsed
from sandbox.runtime.naming import CREATING_MARK, CREATOR_LABEL, Labels, instance_id, scope_key
from sandbox.runtime.protocol import SandboxInfo
from sandbox.runtime.spec import AGENT_LINKS_DIR, SandboxSpec, spec_from_config

if TYPE_CHECKING:  # the engine is imported where a sandbox is first needed, not before
    from sandbox.journal.store import Journal
    from sandbox.runtime.protocol import Backend, Sandbox, WarmPool
    from sandbox.state.protocol import SharedPoolClaims

_K = TypeVar("_K")
_V = TypeVar("_V")
REVALIDATE_AFTER_S = 30.0  # a cached sandbox is re-checked (drift, image) this often
LAST_USED_EVERY_S = 30.0
# identities (sessions, agents, shared) whose sandbox, spec and claim are remembered: at most
# MAX_REMEMBERED (runtime/bounded.py), least recently used out; a service that runs for weeks
# sees unbounded many sessions, and one evicted is found again in the engine (adopted) on its
# next call


@dataclass
class _Entry:
    sandbox: Sandbox
    checked_at: float


class SandboxManager:
    """Maps (agent, session) to a live sandbox, creating exactly one per identity.

    The identity is tenant, scope key and config hash: two sessions share a container only when
    all three agree, and a container is never handed to a session of another identity.

    Args:
        config: the loaded config.
        backend: the container backend.
    """

    def __init__(self, config: Config, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.instance = instance_id(config.state_dir, config.instance)
        # keyed by full identity (tenant, scope key, config hash), never by container name
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._specs: OrderedDict[tuple[str, str, str], SandboxSpec] = OrderedDict()
        self._locks: dict[str, anyio.Lock] = {}  # only while held or awaited (see _locked)
        self._names: OrderedDict[str, str] = OrderedDict()  # container name -> the identity it was handed to
        self._last_used = LastUsed(config.state_dir / "last-used.json")
        self._last_used_written: OrderedDict[str, float] = OrderedDict()
        # pausing idle sandboxes (lifecycle.pause_idle): what this process paused, when it last
        # handed each sandbox out, and the calls using each one now (never paused under a call)
        self.paused: set[str] = set()
        self.used_at: OrderedDict[str, float] = OrderedDict()
        self.in_use: dict[str, int] = {}
        self._freeze_locks: dict[str, anyio.Lock] = {}  # a pause and a thaw of one sandbox take turns
        # where egress proxies' request lines go (set by the orchestrator that owns a journal)
        self.journal: Journal | None = None
        # replicas on one engine: warm-pool members are claimed there too (set by the service)
        self.shared_pool_claims: SharedPoolClaims | None = None
        self.pool: WarmPool | None = backend.warm_pool(self)

    def spec_for(self, agent: EffectiveAgent, session: str) -> SandboxSpec:
        """The spec a session maps to (cached; the config is immutable)."""
        key = (agent.tenant, agent.id, scope_key(agent.sandbox.scope, agent.id, session))
        spec = self._specs.get(key)
        if spec is None:
            spec = spec_from_config(self.config, agent, session, self.instance)
        _remember(self._specs, key, spec)
        return spec

    def _claim(self, spec: SandboxSpec) -> None:
        """Refuse to hand one container to two identities (configs that skipped validation)."""
        owner = self._names.setdefault(spec.name, spec.identity)
        _remember(self._names, spec.name, owner)
        if owner != spec.identity:
            raise SandboxUnavailable(
                f"sandbox {spec.name} is already in use by a session whose effective sandbox differs "
                f"(agent {spec.agent!r}, scope {spec.scope}); a container is shared only by identical "
                "sandboxes (see `sandbox config check`)",
                container=spec.name,
            )

    def known_live(self, spec: SandboxSpec) -> bool:
        """Whether this manager holds `spec`'s sandbox as live, checked recently (no engine call)."""
        entry = self._entries.get(spec.identity)
        return entry is not None and not entry.sandbox.gone and time.monotonic() - entry.checked_at < REVALIDATE_AFTER_S

    async def live(self, agent: EffectiveAgent, session: str) -> Sandbox | None:
        """The session's sandbox while it runs, never made, restarted or replaced here: this
        manager's (checked recently), else the engine's running container that serves the spec as
        it is (a backend that can say so: `adopt`); None otherwise. Previews use it: a link must
        not start or replace a sandbox."""
        spec = self.spec_for(agent, session)
        self._claim(spec)
        entry = self._entries.get(spec.identity)
        if self.known_live(spec) and entry is not None:
            box = entry.sandbox
        else:
            adopt = getattr(self.backend, "adopt", None)
            if adopt is None:  # a backend that cannot say: only what this manager holds
                return entry.sandbox if entry is not None and not entry.sandbox.gone else None
            image = await self.backend.image_id(spec.image)
            found: Sandbox | None = await adopt(
                spec_from_config(self.config, agent, session, self.instance, image_id=image)
            )
            if found is None:
                return None
            box = found
        if spec.name in self.paused:  # thawed like any use (not made)
            await self._thaw(spec)
        _remember(self.used_at, spec.name, time.monotonic())
        return box

    async def sandbox_for(self, agent: EffectiveAgent, session: str) -> Sandbox:
        """The live sandbox of a session: cached, adopted, or created (once per identity)."""
        spec = self.spec_for(agent, session)
        self._claim(spec)
        ident = spec.identity
        entry = self._entries.get(ident)
        now = time.monotonic()
        _remember(self.used_at, spec.name, now)
        if spec.name in self.paused:
            await self._thaw(spec)
        if entry is not None and not entry.sandbox.gone and now - entry.checked_at < REVALIDATE_AFTER_S:
            self._entries.move_to_end(ident)
            self._touch(spec.name, now)
            return entry.sandbox
        async with self._locked(ident):
            entry = self._entries.get(ident)
            if (
                entry is not None
                and not entry.sandbox.gone
                and time.monotonic() - entry.checked_at < REVALIDATE_AFTER_S
            ):
                return entry.sandbox
            image = await self.backend.image_id(spec.image)
            full = spec_from_config(self.config, agent, session, self.instance, image_id=image)
            sandbox = await self._from_pool(full, known=entry is not None) or await self.backend.ensure(full)

            async def revive() -> str:
                # the container died under us: make a new one (once, under the identity's lock)
                self._entries.pop(ident, None)
                return (await self.sandbox_for(agent, session)).id

            sandbox.set_reviver(revive)
            _remember(self._entries, ident, _Entry(sandbox, time.monotonic()))
            self._touch(spec.name, time.monotonic(), force=True)
            return sandbox

    async def _thaw(self, spec: SandboxSpec) -> None:
        """Thaw a sandbox this process paused (once; after a pause under way has ended)."""
        async with self._freezing(spec.name):
            if spec.name in self.paused:
                freezer = self.backend.freezer()
                if freezer is not None:
                    await freezer.thaw(spec.name)
                self.paused.discard(spec.name)

    async def pause_if_idle(self, name: str, busy: Callable[[], Awaitable[bool]] | None) -> bool:
        """Pause sandbox `name` unless a call of this process uses it (or `busy()` says it works);
        whether it was paused. Marked paused before the engine is asked, under the name's lock, so a
        call starting meanwhile thaws it once the pause is done, never runs frozen."""
        freezer = self.backend.freezer()
        if freezer is None:
            return False
        async with self._freezing(name):
            if name in self.in_use:
                return False
            self.paused.add(name)
            try:
                if (busy is not None and await busy()) or not await freezer.pause(name):
                    self.paused.discard(name)
                    return False
            except BaseException:
                self.paused.discard(name)
                raise
            if name in self.in_use:  # a call began during the pause: let it run
                await freezer.thaw(name)
                self.paused.discard(name)
                return False
            return True

    @asynccontextmanager
    async def _freezing(self, name: str) -> AsyncIterator[None]:
        lock = self._freeze_locks.setdefault(name, anyio.Lock())
        async with lock:
            yield

    @contextmanager
    def using(self, name: str) -> Iterator[None]:
        """A call uses sandbox `name` while the block runs: it is not paused meanwhile."""
        self.in_use[name] = self.in_use.get(name, 0) + 1
        try:
            yield
        finally:
            left = self.in_use[name] - 1
            if left:
                self.in_use[name] = left
            else:
                del self.in_use[name]
            _remember(self.used_at, name, time.monotonic())

    def pool_size(self, spec: SandboxSpec) -> int:
        """The warm pool size of the agent whose sandbox `spec` is (0: none)."""
        try:
            return effective_agent(self.config, spec.agent).sandbox.pool.size
        except Exception:  # an agent no longer configured has no pool
            return 0

    async def _from_pool(self, spec: SandboxSpec, *, known: bool) -> Sandbox | None:
        """A warm container for a session that has none yet (never in place of an existing one).

        The engine is asked first, unless the pool's claim checks the name itself and the session
        is new to this process (`known`: its sandbox is only being revalidated, so it most likely
        exists) and no claim store is shared (a replica's claim there is not given back)."""
        if self.pool is None or not self.pool.wanted(spec):
            return None
        ask_first = known or not self.pool.claim_checks_name or self.shared_pool_claims is not None
        if ask_first and await self.backend.exists(spec.name):
            return None
        return await self.pool.claim(spec)

    async def close_session(self, agent: EffectiveAgent, session: str) -> bool:
        """End a session: its session-scoped sandbox goes; agent and shared ones stay."""
        if agent.sandbox.scope != "session":
            return False
        spec = self.spec_for(agent, session)
        async with self._locked(spec.identity):
            self._entries.pop(spec.identity, None)
            if spec.egress is not None:
                await self.collect_egress(spec.name)  # its proxy's last lines, before it goes
            await self.backend.remove(spec.name)
        self._specs.pop((agent.tenant, agent.id, spec.scope_key), None)
        self._names.pop(spec.name, None)
        self._forget_use(spec.name)
        logger.bind(container=spec.name, session=session).info("sandbox_removed")
        return True

    @asynccontextmanager
    async def _locked(self, ident: str) -> AsyncIterator[None]:
        """Hold the identity's lock; the map keeps a lock only while someone holds or awaits it.

        A lock is dropped only when free with no waiter (a release hands it straight to the next
        waiter, which then holds it), and no task can pick it up in between: there is no await
        between taking it from the map and acquiring it.
        """
        lock = self._locks.setdefault(ident, anyio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0 and self._locks.get(ident) is lock:
                del self._locks[ident]

    async def remove(self, info: SandboxInfo) -> None:
        """Remove one sandbox and forget it."""
        for ident, entry in list(self._entries.items()):
            if entry.sandbox.spec.name == info.name:
                self._entries.pop(ident, None)
        self._names.pop(info.name, None)
        await self.collect_egress(info.name)
        await self.backend.remove(info.id)
        self._forget_use(info.name)

    async def collect_egress(self, sandbox_name: str) -> int:
        """Copy the sandbox's egress proxy lines into the journal (none: no proxy, no journal)."""
        egress = self.backend.egress()
        if self.journal is None or egress is None:
            return 0
        return await egress.collect(self.journal, sandbox_name)

    async def list(self, *, tenant: str | None = None) -> builtins.list[SandboxInfo]:
        """This instance's sandboxes, or one tenant's (pool containers handed to a session show
        that session)."""
        if tenant is None:
            found = await self.backend.list(instance=self.instance)
        elif _takes_tenant(self.backend.list):
            found = await self.backend.list(instance=self.instance, tenant=tenant)
        else:  # a backend written before `tenant`: it lists them all, and we keep the tenant's
            found = [info for info in await self.backend.list(instance=self.instance) if info.tenant == tenant]
        if self.pool is None:
            return found
        return [self.pool.as_claimed(info) for info in found]

    async def cleanup_orphans(self) -> builtins.list[str]:
        """Remove half-created containers whose creating process is gone (crash recovery)."""
        removed = []
        host = socket.gethostname()
        found = await self.list()
        for info in found:
            if CREATING_MARK not in info.name:
                continue
            creator = info.labels.get(CREATOR_LABEL, "")
            if "|" in creator:  # host|boot|pid|start (journal/owners.py)
                here = owner_here(creator)
                if here and owner_alive(creator, None, time.time()):
                    continue
            else:  # host:pid, as labelled before the start time was part of it
                c_host, _, c_pid = creator.partition(":")
                here = c_host == host
                if here and c_pid.isdigit() and _pid_alive(int(c_pid)):
                    continue
            if not here and _age_s(info.created_at) < 600:
                continue  # another host may still be creating it
            await self.backend.remove(info.id)
            removed.append(info.name)
            logger.bind(container=info.name).info("sandbox_orphan_removed")
        egress = self.backend.egress()
        if egress is not None:
            removed += await egress.sweep(self.instance)
        in_use = [info.labels.get(Labels.AGENT_LINK, "") for info in found]
        root = str(self.config.state_dir / AGENT_LINKS_DIR)
        removed += await anyio.to_thread.run_sync(link_folders.sweep, root, in_use, time.time())
        return removed

    def last_used(self) -> dict[str, str]:
        """Container name -> ISO time of last use (kept in the state dir; labels are immutable)."""
        return self._last_used.read()

    def _forget_use(self, name: str) -> None:
        """A removed sandbox's last use and pause state go, from memory and from the state dir's
        file (a prune removes idle sandboxes, which are the paused ones)."""
        self._last_used_written.pop(name, None)
        self._last_used.forget(name)
        self.paused.discard(name)
        drop_if_idle(self._freeze_locks, name)

    def _touch(self, name: str, now: float, *, force: bool = False) -> None:
        if not force and now - self._last_used_written.get(name, 0.0) < LAST_USED_EVERY_S:
            return
        _remember(self._last_used_written, name, now)
        self._last_used.touch(name)


def _remember(cache: OrderedDict[_K, _V], key: _K, value: _V) -> None:
    remember(cache, key, value, MAX_REMEMBERED)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _age_s(iso: str) -> float:
    try:
        return (datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds()
    except ValueError:
        return float("inf")


def _takes_tenant(method: Callable[..., object]) -> bool:
    """Whether a backend's `list` takes `tenant` (third-party backends written before it do not)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read: asked as the protocol says
        return True
    return any(p.name == "tenant" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
