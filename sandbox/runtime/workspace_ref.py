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
class Volume:
    """A volume the engine keeps, by name (`workspace_store: volume`): no path on this host."""

    name: str

    @property
    def source(self) -> str:
        """What the engine mounts: the volume's name."""
        return self.name

    @property
    def host_path(self) -> None:
        """None: a volume is not a folder of this host (even where a local engine keeps one)."""
        return None


@dataclass(frozen=True)
class Remote:
    """A workspace a remote backend keeps where it runs the sandbox (Kubernetes: the agent's
    claim, or the Pod's own scratch), by an identity name: no path on this host, reached only
    through the sandbox's resident agent."""

    name: str

    @property
    def source(self) -> str:
        """The workspace's identity (locks and file versions key on it); the backend mounts its own."""
        return self.name

    @property
    def host_path(self) -> None:
        """None: it is not on this host."""
        return None


WorkspaceRef: TypeAlias = HostFolder | Volume | Remote
