"""Which path a sandbox's commands take, and the resident agents of one backend.

An image that carries the agent says so in its labels (images/sandbox/Dockerfile); its
sandboxes get one agent per user, started on first use and restarted after it dies. Every
other sandbox and a config with `docker.agent: off` use plain docker exec (`explain` and
`doctor` say which, and why); so does a user whose agent could not start in a container, until
it is tried again there (after 30 s, then twice as long each time it fails, up to 30 minutes).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from sandbox._log import logger
from sandbox.runtime.agent.exec_path import ExecPath, path_from_labels
from sandbox.runtime.agent.link import AgentLink, AgentUnavailable
from sandbox.runtime.bounded import drop_if_idle

if TYPE_CHECKING:
    from sandbox.runtime.agent.transport import AgentStarter
    from sandbox.runtime.spec import SandboxSpec

IMAGE_CACHE_S = 10.0
# An agent that could not start is tried again after this, then after twice as long each time
# it fails again: a pids limit or memory another session filled for a moment must not keep a
# user on docker exec for good, and an image that cannot run it costs one failed start per period.
RETRY_FIRST_S = 30.0
RETRY_MAX_S = 1800.0
clock = time.monotonic  # the refusals' clock (tests move it)
# Links are looked over this often for streams that ended while idle: a container removed by
# another process (a CLI prune, a replica, the engine) would otherwise keep its link's socket and
# pipes open here until the service runs out of descriptors.
SWEEP_EVERY_S = 30.0


@dataclass(frozen=True)
class Refusal:
    """Why one user's agent is not used in a container, and until when."""

    why: str
    until: float  # clock()
    wait_s: float  # the period that ended a failed start (doubled at the next)


class ResidentAgents:
    """The agent links of one backend: at most one per (container, user), started, asked about
    and killed through the backend's `starter`."""

    def __init__(self, starter: AgentStarter) -> None:
        self._starter = starter
        self._links: dict[tuple[str, str], AgentLink] = {}
        self._locks: defaultdict[tuple[str, str], anyio.Lock] = defaultdict(anyio.Lock)
        self._paths: dict[tuple[str, str], tuple[float, ExecPath]] = {}
        # (container id, user) -> why that user's agent is not used there: one user's agent that
        # cannot start (a session filled the pids limit as it did) leaves the others' alone
        self._refused: dict[tuple[str, str], Refusal] = {}
        self.started = 0  # agents started by this backend (restarts included)
        self._swept_at = clock()
        self._dead_seen: set[tuple[str, str]] = set()  # links found dead in a call at the last look

    async def exec_path(self, spec: SandboxSpec, container_id: str | None = None, user: str | None = None) -> ExecPath:
        """The path commands of `spec`'s sandbox take (`container_id`: also its own history, for
        `user`, or for any user when None)."""
        now = clock()
        for (refused_id, refused_user), refusal in self._refused.items():
            if refused_id == container_id and user in (None, refused_user) and now < refusal.until:
                return ExecPath(
                    "docker exec",
                    f"the agent could not start here for user {refused_user}: {refusal.why} "
                    f"(tried again in {refusal.until - now:.0f} s)",
                )
        mode = spec.docker.agent
        key = (spec.image, mode)
        cached = self._paths.get(key)
        if cached and now - cached[0] < IMAGE_CACHE_S:
            return cached[1]
        found = await self._starter.image_labels(spec.image) if mode != "off" else None
        path = path_from_labels(found, mode)
        self._paths[key] = (now, path)
        return path

    async def link(self, container_id: str, spec: SandboxSpec, user: str | None) -> AgentLink | None:
        """The live link for this container and user, started when needed; None: use docker exec."""
        key = (container_id, user or spec.user)  # no user: docker exec runs as the container's
        self._sweep()
        link = self._links.get(key)
        if link is not None and link.check():
            return link
        path = await self.exec_path(spec, container_id, key[1])
        if path.agent_path is None:
            return None
        async with self._locks[key]:
            link = self._links.get(key)
            if link is not None and link.dead is None:
                return link
            if link is not None:  # a dead one: a stopped or lying agent must not linger
                del self._links[key]
                await self._starter.kill(container_id, link.transport)
            refused = self._refused.get(key)
            if refused is not None and clock() < refused.until:
                return None
            try:
                link = await AgentLink.open(self._starter, container_id, path.agent_path, user, link=path.link)
            except AgentUnavailable as exc:
                # the image says it has an agent, but it does not run here (no python for this
                # user, a full pids limit, a custom image): commands still run, by docker exec
                wait_s = RETRY_FIRST_S if refused is None else min(refused.wait_s * 2, RETRY_MAX_S)
                self._refused[key] = Refusal(exc.message, clock() + wait_s, wait_s)
                logger.bind(container=spec.name, user=key[1]).warning(
                    "agent_unavailable_fallback", reason=exc.message, retry_s=wait_s
                )
                return None
            self._refused.pop(key, None)
            self._links[key] = link
            self.started += 1
            return link

    def _sweep(self) -> None:
        """Drop the links whose stream ended while idle (their descriptors close with them), and
        refusals long over; at most every SWEEP_EVERY_S. A few microseconds a link."""
        now = clock()
        if now - self._swept_at < SWEEP_EVERY_S:
            return
        self._swept_at = now
        dead_before, self._dead_seen = self._dead_seen, set()
        for key, link in list(self._links.items()):
            was_dead = link.dead is not None
            if link.check():
                continue
            # dropped when it ended while idle (its agent is gone), or when it died in a call
            # and no call came for a whole period to replace it and kill its agent (its container
            # was removed elsewhere); its descriptors closed as it died
            if was_dead and key not in dead_before:
                self._dead_seen.add(key)
                continue
            del self._links[key]
            drop_if_idle(self._locks, key)
        for key in [k for k, r in self._refused.items() if now >= r.until + RETRY_MAX_S]:
            del self._refused[key]  # its backoff is forgotten too: the next failure waits RETRY_FIRST_S

    def forget(self, container_id: str) -> None:
        """Close and drop the links of a container (removed, or replaced)."""
        for key in [k for k in self._links if k[0] == container_id]:
            self._links.pop(key).close("the sandbox was removed")
        for key in [k for k in self._locks if k[0] == container_id]:
            self._locks.pop(key, None)
        for key in [k for k in self._refused if k[0] == container_id]:
            del self._refused[key]

    def close(self, container_id: str, user: str) -> None:
        """Close one user's agent in a container (root's, once setup is done: no root process
        stays in a sandbox because of us)."""
        key = (container_id, user)
        link = self._links.pop(key, None)
        if link is not None:
            link.close("its work in the sandbox is done")
        drop_if_idle(self._locks, key)
        self._refused.pop(key, None)

    def close_all(self) -> None:
        """Close every link (the backend is closing)."""
        for link in self._links.values():
            link.close("the orchestrator closed its engine connection")
        self._links.clear()
