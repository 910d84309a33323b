"""Whether a sandbox's workspace bind still holds the host folder it was made with.

A bind mount holds the folder (its inode), not its path. When the folder is removed on the host
(or removed and made again), the container keeps a dead directory: every exec fails with the
engine's "current working directory is outside of container mount namespace root" and the
health check fails for ever. So the folder's device and inode are recorded as a label when the
container is created, and compared with the path's before each use: a mismatch makes the
sandbox gone, and it is created again on a workspace made again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sandbox.runtime.bounded import remember
from sandbox.runtime.naming import LABEL_PREFIX
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.docker.backend import DockerBackend

WORKSPACE_ID_LABEL = f"{LABEL_PREFIX}.workspace-inode"
MISSING = "missing"


def workspace_id(spec: SandboxSpec) -> str | None:
    """`device:inode` of the workspace's host folder now; None for a volume (the engine's),
    MISSING when the folder is gone. A stat of a local path: cheap enough before each exec."""
    folder = spec.workspace.host_path
    if folder is None:
        return None
    try:
        st = os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        return MISSING
    return f"{st.st_dev}:{st.st_ino}"


def workspace_lost(recorded: str | None, spec: SandboxSpec) -> bool:
    """Whether the folder recorded at creation is no longer the one at the workspace's path.
    A container made before the label existed (None, or empty) is taken as it is."""
    if not recorded:
        return False
    return workspace_id(spec) != recorded


def recorded_id(labels: Mapping[str, str]) -> str:
    """The workspace id a container was created with ("" when it has none)."""
    return str(labels.get(WORKSPACE_ID_LABEL, ""))


async def recorded_for(backend: DockerBackend, container_id: str) -> str:
    """The workspace id a container was made with: known since it was made or adopted here, else
    read from its label (once per container)."""
    known = backend.workspace_ids.get(container_id)
    if known is None:
        attrs = await backend.find(container_id)
        known = recorded_id((attrs.get("Config") or {}).get("Labels") or {}) if attrs else ""
        remember(backend.workspace_ids, container_id, known)
    return known


def lost_message(spec: SandboxSpec) -> str:
    """What a caller is told when the workspace cannot be used and was not made again."""
    return (
        f"the sandbox's workspace folder {spec.workspace.source} was removed (or replaced) on the host "
        "after the sandbox was made, so commands in it cannot start; the sandbox is made again on "
        "next use"
    )
