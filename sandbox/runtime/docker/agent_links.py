"""Which Docker sandboxes get a folder of agent FIFOs (runtime/link_folders.py), and where an
agent's FIFOs go (runtime/agent/fifo_link.py).

The engine must see this process's files at the same paths. That is not guessed: the first
sandbox is created with its folder (a new random name), and an engine that cannot see it
refuses the bind ("bind source path does not exist": a remote engine, or compose, where the
state dir is a named volume); that sandbox is then created without it, and so are the
backend's later ones. With `SANDBOX_AGENT_LINK=stream` no sandbox gets a folder. Without a
folder, agents keep the exec stream.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import docker.errors

from sandbox.runtime import link_folders
from sandbox.runtime.agent.fifo_link import INSIDE, LinkPlace, can_own, uid_of
from sandbox.runtime.bounded import remember
from sandbox.runtime.naming import Labels

if TYPE_CHECKING:
    from sandbox.runtime.docker.backend import DockerBackend
    from sandbox.runtime.spec import SandboxSpec


class AgentLinkFolders:
    """The link folders of one backend's sandboxes: made with them, looked up for their agents."""

    def __init__(self, backend: DockerBackend) -> None:
        self._backend = backend
        # container id -> (folder or "", default user); bounded: a miss inspects the container again
        self._known: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._refusal: str | None = None  # "" once checked and none

    @property
    def refusal(self) -> str | None:
        """Why this engine's sandboxes get no link folder (None: they do, as far as known)."""
        if self._refusal is None:
            self._refusal = link_folders.refused_here() or ""
        return self._refusal or None

    def refuse(self, reason: str) -> None:
        """Give no new sandbox a folder, and no agent FIFOs, from now on (the agents started
        already keep their links)."""
        self._refusal = reason

    def unseen(self, exc: docker.errors.APIError, kwargs: dict[str, Any]) -> bool:
        """Whether a create failed because the engine cannot see the link folder in `kwargs`;
        if so, the folder's mount and label are taken out of them, and later sandboxes get none."""
        folder = kwargs["labels"].get(Labels.AGENT_LINK)
        if not folder or "bind source path does not exist" not in str(exc) or folder not in str(exc):
            return False
        self.refuse("the engine does not see this process's state dir at the same path")
        kwargs["labels"].pop(Labels.AGENT_LINK)
        kwargs["mounts"] = [m for m in kwargs["mounts"] if m.get("Source") != folder]
        return True

    async def new_folder(self, spec: SandboxSpec) -> str | None:
        """A new link folder for `spec`'s sandbox (None: its agents keep the exec stream)."""
        if spec.kind != "exec" or not spec.agent_links or self.refusal is not None:
            return None
        return str(await anyio.to_thread.run_sync(link_folders.make, spec.agent_links))

    def made(self, container_id: str, folder: str | None, user: str) -> None:
        """Remember a new sandbox's folder (no inspect when its first agent starts)."""
        remember(self._known, container_id, (folder or "", user))

    def forget(self, container_id: str) -> None:
        self._known.pop(container_id, None)

    async def place(self, container_id: str, user: str | None) -> LinkPlace | None:
        """Where an agent of `container_id` running as `user` gets its FIFOs; None: it keeps the
        stream (a sandbox made without a folder, a user by name, a uid this process cannot give
        a FIFO to)."""
        known = self._known.get(container_id)
        if known is None:
            attrs = await self._backend.find(container_id)
            if attrs is None:
                return None
            known = (folder_in(attrs) or "", str((attrs.get("Config") or {}).get("User") or ""))
            remember(self._known, container_id, known)
        folder, default_user = known
        uid = uid_of(user or default_user)
        if not folder or uid is None or not can_own(uid) or self.refusal is not None:
            return None
        return LinkPlace(Path(folder), INSIDE, uid)


def folder_in(attrs: dict[str, Any]) -> str | None:
    """The link folder a container was made with, from its mounts (what the engine really binds),
    never from a label, which the image's own labels can supply: a read-only bind at
    :data:`INSIDE` of a folder shaped like ours (runtime/link_folders.py)."""
    for mount in attrs.get("Mounts") or []:
        if mount.get("Destination") == INSIDE and mount.get("Type") == "bind" and not mount.get("RW"):
            source = str(mount.get("Source") or "")
            return source if link_folders.is_link_folder(source) else None
    return None
