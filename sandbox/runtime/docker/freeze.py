"""Pausing idle sandboxes on Docker: the engine's pause (the cgroup freezer), so an idle sandbox
costs no CPU; its memory stays. `busy` reads the container's processes from the engine (`docker
top`, no exec): anything besides its init, its keep-alive and its resident agents is work."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import docker.errors

from sandbox._log import logger

if TYPE_CHECKING:
    from sandbox.runtime.docker.backend import DockerBackend

# what an idle sandbox runs, by exact command line: its inits (the engine's, the image's tini) with the keep-alive, the
# keep-alive, and the resident agents (one per user; where the image carries it, or its copy)
BASELINE = frozenset(
    {
        "/sbin/docker-init -- /usr/bin/tini -- sleep infinity",  # docker.init: the engine's init first
        "/sbin/docker-init -- sleep infinity",
        "/usr/bin/tini -- sleep infinity",
        "sleep infinity",
    }
)
AGENTS = (
    "/usr/local/lib/sandbox-agent/agent.pyc",  # compiled in the image (images/sandbox/Dockerfile)
    "/usr/local/lib/sandbox-agent/agent.py",  # images built before it was
    "/opt/sandbox-agent/agent.py",  # the Kubernetes copy
)


def _idle_process(args: str) -> bool:
    """Whether a command line is one an idle sandbox runs. A process inside may name itself so
    (exec -a): it then only keeps its own sandbox from being left running (the harm is its own)."""
    words = args.split()
    agent = len(words) >= 2 and words[0].rsplit("/", 1)[-1].startswith("python3") and any(a in words for a in AGENTS)
    return args.strip() in BASELINE or agent


class DockerFreezer:
    """`Backend.freezer` on Docker (runtime/protocol.py: Freezer)."""

    def __init__(self, backend: DockerBackend) -> None:
        self._backend = backend

    async def pause(self, name_or_id: str) -> bool:
        """`docker pause`; False when it is not running (gone, or paused already)."""
        return await self._backend.call("pause sandbox", self._pause, name_or_id)

    async def thaw(self, name_or_id: str) -> bool:
        """`docker unpause`; False when it was not paused."""
        return await self._backend.call("thaw sandbox", self._thaw, name_or_id)

    async def busy(self, name_or_id: str) -> bool:
        """Whether it runs anything but its init, keep-alive and agents (`docker top`)."""
        return await self._backend.call("list sandbox processes", self._busy, name_or_id)

    def _pause(self, name_or_id: str) -> bool:
        try:
            self._backend.client.api.pause(name_or_id)
        except (docker.errors.NotFound, docker.errors.APIError) as exc:
            if isinstance(exc, docker.errors.NotFound) or getattr(exc, "status_code", None) == 409:
                return False
            raise
        logger.bind(container=name_or_id).info("sandbox_paused")
        return True

    def _thaw(self, name_or_id: str) -> bool:
        try:
            self._backend.client.api.unpause(name_or_id)
        except (docker.errors.NotFound, docker.errors.APIError) as exc:
            if isinstance(exc, docker.errors.NotFound) or getattr(exc, "status_code", None) == 409:
                return False
            raise
        logger.bind(container=name_or_id).info("sandbox_thawed")
        return True

    def _busy(self, name_or_id: str) -> bool:
        try:
            top: dict[str, Any] = self._backend.client.api.top(name_or_id, ps_args="-eo pid,args")
        except docker.errors.NotFound:
            return False
        titles = [str(t).upper() for t in top.get("Titles") or []]
        column = titles.index("COMMAND") if "COMMAND" in titles else len(titles) - 1
        for row in top.get("Processes") or []:
            args = str(row[column]) if column < len(row) else ""
            if not _idle_process(args):
                return True
        return False
