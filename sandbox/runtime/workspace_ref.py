"""What a sandbox's workspace is, by reference: a folder on this host or a volume the engine keeps.

A spec names its workspace this way instead of by a host path, so code that needs a host folder
(file tools, quotas, the warm pool's scratch hand-over) says so, and a workspace with no path on
this host (a Docker volume; later a claim a Kubernetes backend mounts) is never taken for one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias


@dataclass(frozen=True)
class HostFolder:
    """A folder on this host, bind-mounted at the workdir (`workspace_store: host`)."""

    path: Path  # its real path: what the engine mounts

    @property
    def source(self) -> str:
        """What the engine mounts: the folder's path."""
        return str(self.path)

    @property
    def host_path(self) -> Path:
        """The folder on this host: its path."""
        return self.path


@dataclass(frozen=True)
class _Elsewhere:
    """A workspace known by a name, with no path on this host."""

    name: str

    @property
    def source(self) -> str:
        """What the engine mounts (a volume's name), or the workspace's identity (a cluster's)."""
        return self.name

    @property
    def host_path(self) -> None:
        """None: it is not a folder of this host (even where a local engine keeps a volume)."""
        return None


@dataclass(frozen=True)
class Volume(_Elsewhere):
    """A volume the engine keeps, by name (`workspace_store: volume`)."""


@dataclass(frozen=True)
class Remote(_Elsewhere):
    """A workspace a remote backend keeps where it runs the sandbox (Kubernetes: the agent's
    claim, or the Pod's own scratch), reached only through the sandbox's resident agent; its
    name is an identity (locks and file versions key on it), the backend mounts its own."""


WorkspaceRef: TypeAlias = HostFolder | Volume | Remote
