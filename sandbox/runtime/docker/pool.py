"""The warm pool: sandboxes made before their session exists, handed to a new session at once.

`sandbox.pool.size: N` keeps N started sandboxes (their resident agent up) per pool key: the
effective sandbox of an agent's sessions minus what names one session (image, hardening,
binds, user, tenant, instance; see SandboxSpec.pool_key). Only session-scoped sandboxes without
an egress edge or a parent's view are pooled: those are the ones a new session waits for.

A claim is a file made with O_EXCL under the state dir (`pool/claims/<container id>`), so two
sessions, even in two processes on one state dir, never get one container. The claimed
container is then renamed to the session's name and its scratch workspace folder to the
session's (the container's bind mount follows the folder, not its path). A claimed container
never goes back: any failure after the claim file exists removes it. Unclaimed members whose
key no current config wants (drift), that stopped (an engine restart), or that were claimed by
a process that died before the rename, are removed by the pool and by `sandbox prune`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from sandbox._log import logger
from sandbox.config.merge import EffectiveAgent
from sandbox.errors import ErrorCode, SandboxError, SandboxUnavailable
from sandbox.runtime import pool_plan
from sandbox.runtime.docker.sandbox import DockerSandbox
from sandbox.runtime.naming import CREATING_MARK, Labels
from sandbox.runtime.protocol import Sandbox, SandboxInfo, pool_member, under_pool_name
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.docker.backend import DockerBackend
    from sandbox.runtime.manager import SandboxManager
    from sandbox.state.protocol import SharedPoolClaims

CLAIM_GRACE_S = 60.0  # a claim younger than this may still be renaming its container
REFILL_EVERY_S = 5.0  # the pool is checked this often, and at once after a claim
LOST_CLAIMS_EVERY_S = 600.0  # claim files of containers removed elsewhere are looked for this often
LOST_CLAIMS_AT_ONCE = 100  # engine lookups per look, at most


@dataclass(frozen=True)
class Claim:
    """Who a pool container was handed to (its labels still say `pool`: they cannot change)."""

    container_id: str
    name: str
    tenant: str
    scope_key: str
    session: str
    config_hash: str
    claimed_at: float


class PoolClaims:
    """The claim files of one state dir: an O_EXCL create is the atomic hand-over."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "pool" / "claims"

    def _path(self, container_id: str) -> Path:
        if not container_id.isalnum():
            raise ValueError(f"not a container id: {container_id!r}")
        return self.root / container_id

    def take(self, container_id: str, spec: SandboxSpec) -> bool:
        """Claim a container for `spec`'s session; False when someone else already did."""
        self.root.mkdir(parents=True, exist_ok=True)
        record = {
            "container_id": container_id,
            "name": spec.name,
            "tenant": spec.tenant,
            "scope_key": spec.scope_key,
            "session": spec.session,
            "config_hash": spec.config_hash,
            "claimed_at": time.time(),
        }
        try:
            fd = os.open(self._path(container_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as out:
            json.dump(record, out)
        return True

    def get(self, container_id: str) -> Claim | None:
        """The claim of a container, if any (an unreadable record is no claim: never handed out)."""
        try:
            data = json.loads(self._path(container_id).read_text())
            return Claim(**data)
        except (OSError, ValueError, TypeError):
            return None

    def claimed(self, container_id: str) -> bool:
        """Whether a claim file exists (even a half-written one: that container is not free)."""
        return self._path(container_id).exists()

    def drop(self, container_id: str) -> None:
        """Forget the claim of a container that is gone."""
        with contextlib.suppress(OSError, ValueError):
            self._path(container_id).unlink()

    def ids(self) -> Iterator[str]:
        """Container ids with a claim file."""
        if self.root.is_dir():
            yield from (p.name for p in self.root.iterdir())


class WarmPool:
    """The pools of one manager: filling, claiming, sweeping."""

    claim_checks_name = True  # the hand-over's rename fails on a name in use (see _hand_over)

    def __init__(self, manager: SandboxManager, backend: DockerBackend) -> None:
        self.manager = manager
        self.backend = backend
        self.claims = PoolClaims(manager.config.state_dir)
        self.wake = anyio.Event()
        self._claiming: set[str] = set()  # container ids this process is handing over now
        self._free: dict[str, list[SandboxInfo]] = {}  # pool key -> members this process knows free
        self._lost_claims_at = -math.inf  # when claim files were last checked against the engine (monotonic)

    # -- which agents have a pool ------------------------------------------------------------

    def pooled_agents(self) -> list[EffectiveAgent]:
        """Configured agents whose sandboxes are pooled (size > 0, sandboxed, session scope)."""
        return pool_plan.pooled_agents(self.manager)

    async def member_spec(self, agent: EffectiveAgent) -> SandboxSpec | None:
        """The spec of a new pool member of `agent`, or None when its sandboxes cannot be pooled."""
        return await pool_plan.member_spec(self.manager, self.backend, agent)

    def as_claimed(self, info: SandboxInfo) -> SandboxInfo:
        """A listed pool container as the session it was handed to sees it (labels cannot say)."""
        if not pool_member(info):
            return info
        claim = self.claims.get(info.id)
        if claim is None or claim.name != info.name:
            return info
        return dataclasses.replace(
            info,
            scope="session",
            scope_key=claim.scope_key,
            session=claim.session,
            config_hash=claim.config_hash,
        )

    # -- claiming ------------------------------------------------------------------------------

    def wanted(self, spec: SandboxSpec) -> bool:
        """Whether `spec`'s session may take a pooled container (its agent has a pool)."""
        agent_pool = self.manager.pool_size(spec)
        if agent_pool <= 0 or spec.pool_key is None:
            return False
        # a scratch workspace that exists already holds this session's files: it is kept and a
        # container is made for it (the pool's folder could not take its place)
        return not (spec.scratch_folder is not None and os.path.lexists(spec.scratch_folder))

    async def claim(self, spec: SandboxSpec) -> DockerSandbox | None:
        """A started pool container for `spec`'s session, renamed to it; None when none is free."""

        key = spec.pool_key or ""
        for source in ("made here", "on the engine"):
            # the members this process made are known without asking the engine; others'
            # (another process on this state dir) are listed when those are used up
            candidates = self._free.setdefault(key, []) if source == "made here" else await self._members(key)
            while candidates:
                info = candidates.pop(0)
                try:
                    box = await self._try(info, spec)
                except NotForPool:
                    return None  # the session has a sandbox of its own already
                if box is not None:
                    return box
        self.wake.set()  # empty: fill now, for the next session
        return None

    async def _try(self, info: SandboxInfo, spec: SandboxSpec) -> DockerSandbox | None:
        """Claim one member for `spec` and hand it over; None when it is not (or no longer) free."""
        if not self._free_name(info) or info.tenant != spec.tenant or not info.running or self.claims.claimed(info.id):
            return None
        if not self.claims.take(info.id, spec):
            return None  # another session (maybe another process) took it first
        shared = self.manager.shared_pool_claims
        if shared is not None:
            try:
                ours = await self._claimed_shared(shared, info.id, spec.session)
            except BaseException:
                self.claims.drop(info.id)  # cancelled while asking: the member is not ours
                raise
            if not ours:
                self.claims.drop(info.id)  # another replica's: never ours to remove either
                return None
        self._claiming.add(info.id)
        try:
            await self._hand_over(info, spec)
        except NotForPool:
            # nothing was handed over: the member stays free for the next session
            self.claims.drop(info.id)
            self._free.setdefault(spec.pool_key or "", []).insert(0, info)
            raise
        except BaseException as exc:
            # claimed means never handed to anyone else: it goes
            with anyio.CancelScope(shield=True):
                await self.backend.remove(info.id)
                self.claims.drop(info.id)
            if not isinstance(exc, (SandboxError, OSError)):
                raise
            logger.bind(container=info.name, session=spec.session).warning("pool_claim_failed", error=str(exc))
            return None
        finally:
            self._claiming.discard(info.id)
        self.wake.set()  # refill
        logger.bind(container=spec.name, member=info.name, session=spec.session).info("pool_claimed")
        return DockerSandbox(self.backend, info.id, spec)

    async def _claimed_shared(self, shared: SharedPoolClaims, container_id: str, session: str) -> bool:
        """The claim in the shared store (replicas on one engine have state dirs of their own)."""
        try:
            return await shared.claim_member(container_id, session)
        except SandboxError as exc:  # the store away: a new container instead, never a guess
            logger.bind(error=exc.message[:200]).warning("pool_claim_not_shared")
            return False

    async def _hand_over(self, info: SandboxInfo, spec: SandboxSpec) -> None:
        """Give the member the session's name, then its scratch folder. The rename is also the
        check that the session has no sandbox yet (a name is taken only once). It comes first, so
        a refused one has changed nothing; a scratch move that fails after it removes the member
        (in _try), and the session gets a container of its own on what is at its path.

        Raises:
            NotForPool: the session's name is in use (nothing was changed).
        """
        move: tuple[Path, Path] | None = None  # the member's scratch folder -> the session's
        if spec.workspace_access == "none":
            scratch = info.labels.get(Labels.POOL_SCRATCH)
            if not scratch or spec.scratch_folder is None:
                raise SandboxUnavailable(f"pool container {info.name} has no scratch workspace")
            move = (Path(scratch), spec.scratch_folder)
        try:
            await self.backend.call("rename pooled sandbox", self.backend.client.api.rename, info.id, spec.name)
        except SandboxError as exc:
            if exc.code != ErrorCode.CONFLICT or not await self.backend.exists(spec.name):
                raise
            raise NotForPool(f"{spec.name} exists already") from exc
        if move is not None:
            _move_scratch(*move)  # a mkdir and a rename in the orchestrator's own folder: no thread hop

    def _made(self, box: Sandbox, spec: SandboxSpec) -> None:
        """A member just started is known free without asking the engine."""
        self._free.setdefault(spec.pool_key or "", []).append(_member_info(box.id, spec))

    def _free_name(self, info: SandboxInfo) -> bool:
        """Still under its pool name: never handed out (a hand-over renames it), and made: a
        member still being made (by this or another process on the state dir, under its
        `-creating-` name) is neither claimed nor swept as stale (it is not running yet); one whose
        maker died is removed by cleanup_orphans, by its creator's liveness."""
        return under_pool_name(info) and CREATING_MARK not in info.name

    async def _all_members(self) -> list[SandboxInfo]:
        """Every container made as a pool member, free or handed out (its pool label stays)."""
        return await self.backend.list(instance=self.manager.instance, kind="exec", label=Labels.POOL)

    async def _members(self, key: str) -> list[SandboxInfo]:
        return await self.backend.list(instance=self.manager.instance, kind="exec", label=f"{Labels.POOL}={key}")

    # -- filling -------------------------------------------------------------------------------

    async def fill_once(self) -> int:
        """Make the missing members of every pool (and sweep stale ones); returns how many were made."""
        made = 0
        await self.sweep()
        for agent in self.pooled_agents():
            try:
                template = await self.member_spec(agent)
            except SandboxError as exc:
                logger.bind(agent=agent.id).warning("pool_unavailable", error=exc.message)
                continue
            if template is None or template.pool_key is None:
                continue
            free = [
                i
                for i in await self._members(template.pool_key)
                if self._free_name(i) and i.running and not self.claims.claimed(i.id) and i.tenant == agent.tenant
            ]
            self._free[template.pool_key] = free
            missing = min(agent.sandbox.pool.size - len(free), await pool_plan.room(self.manager, self.backend, agent))
            if missing <= 0:
                continue
            made += await pool_plan.make_members(self, self.backend, agent, missing, self._made)
        return made

    async def keep_filled(self) -> None:
        """Fill every pool, then again after each claim or every few seconds (a background task)."""
        while True:
            self.wake = anyio.Event()
            try:
                await self.fill_once()
            except Exception as exc:  # the engine away, a bad image: said, and tried again later
                logger.warning("pool_fill_failed", error=f"{exc.__class__.__name__}: {exc}")
            with anyio.move_on_after(REFILL_EVERY_S):
                await self.wake.wait()

    # -- sweeping ------------------------------------------------------------------------------

    async def stale(self) -> list[tuple[SandboxInfo, str]]:
        """Pool containers of this instance that will never be handed out, and why."""
        wanted = await pool_plan.wanted_keys(self)
        out = []
        for info in await self._all_members():
            key = info.labels.get(Labels.POOL)
            if not key or info.id in self._claiming or not self._free_name(info):
                continue  # a renamed one is a session's sandbox, whatever became of its claim file
            claim = self.claims.get(info.id)
            if claim is not None and claim.name == info.name:
                continue  # handed out: a session's sandbox now
            if self.claims.claimed(info.id):
                if claim is not None and time.time() - claim.claimed_at < CLAIM_GRACE_S:
                    continue  # being handed over (maybe by another process): not stale yet
                out.append((info, "claimed, but never handed out (its claimer stopped)"))
            elif not info.running:
                out.append((info, f"pool member is {info.status} (an engine restart?)"))
            elif key not in wanted:
                out.append((info, "pool member of a config that changed (or a pool that is gone)"))
        return out

    async def sweep(self) -> list[str]:
        """Remove the stale pool containers (their names), and now and then the claim files of
        containers removed by another process."""
        removed = await pool_plan.sweep(self)
        if time.monotonic() - self._lost_claims_at >= LOST_CLAIMS_EVERY_S:
            self._lost_claims_at = time.monotonic()
            await self.drop_lost_claims()
        return removed

    async def drop_lost_claims(self) -> int:
        """Drop the claim files whose container the engine no longer has (removed by a CLI prune, a
        replica, by hand: this process's own removals drop theirs); how many went. One older than
        CLAIM_GRACE_S only: a younger one may belong to a hand-over under way elsewhere."""
        listed = {i.id for i in await self._all_members()}  # a claim is only ever of a pool member
        dropped = 0
        looked = 0
        # in no fixed order: claims this instance cannot see (another instance's, on this state
        # dir) must not take every lookup of every round
        for container_id in random.sample(found := list(self.claims.ids()), len(found)):
            if (
                container_id in listed
                or container_id in self._claiming
                or not container_id.isalnum()
                or looked >= LOST_CLAIMS_AT_ONCE
            ):
                continue
            claim = self.claims.get(container_id)
            if claim is not None and time.time() - claim.claimed_at < CLAIM_GRACE_S:
                continue
            looked += 1  # another instance's container on this state dir is not listed: asked by id
            if await self.backend.find(container_id) is None:
                self.claims.drop(container_id)
                dropped += 1
        return dropped

    async def remove_member(self, info: SandboxInfo) -> None:
        """Remove a pool container never handed out, with its claim and scratch folder."""
        await self.backend.remove(info.id)
        self.claims.drop(info.id)
        for members in self._free.values():
            members[:] = [m for m in members if m.id != info.id]
        await anyio.to_thread.run_sync(_remove_scratch, info)


class NotForPool(Exception):
    """The session already has a sandbox of its own: no member is handed to it."""


def _move_scratch(source: Path, target: Path) -> None:
    """Give the pool container's scratch folder the session's path. The container keeps the
    folder (a bind mount holds it, not its path); the host-side file tools find it there now."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(target):
        raise SandboxUnavailable(f"{target} exists already; the session keeps its own workspace")
    os.rename(source, target)


def _member_info(container_id: str, spec: SandboxSpec) -> SandboxInfo:
    """What the engine would list for a member just made (without asking it)."""
    made = SandboxInfo.from_spec(spec, created_at="")
    return dataclasses.replace(made, id=container_id, scope="pool", labels=spec.labels())


def _remove_scratch(info: SandboxInfo) -> None:
    """An unclaimed member's scratch folder goes with it (nothing of a session is in it)."""
    folder = info.labels.get(Labels.POOL_SCRATCH)
    if folder:
        with contextlib.suppress(OSError):
            shutil.rmtree(folder)
