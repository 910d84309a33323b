"""Choosing the sandbox backend by name (`runtime.backend`), importing it only when chosen; the
other implementations the engine is handed (mode off's shell, a volume's files) are named here too."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.errors import ErrorCode, SandboxError

if TYPE_CHECKING:
    from sandbox.config.models import Config, FsSection
    from sandbox.fs.quota import WorkspaceQuota
    from sandbox.fs.states import SeenFiles
    from sandbox.fs.workspace import Root, WorkspaceFiles
    from sandbox.runtime.protocol import AgentChannel, Backend, Shell

# name -> (module, what it needs installed)
_BACKENDS = {
    "docker": ("sandbox.runtime.docker.backend", "the docker SDK: pip install 'docker>=7.1'"),
    "host": ("sandbox.runtime.host.backend", "nothing"),
    "kubernetes": ("sandbox.runtime.kubernetes.backend", "the official client: pip install 'agent-sandbox[k8s]'"),
}


def backend_for(config: Config) -> Backend:
    """A new backend of the kind `config.runtime.backend` names.

    Raises:
        SandboxError: SANDBOX_UNAVAILABLE naming what to install when the backend's module
            cannot be imported.
    """
    name = config.runtime.backend
    module_name, needs = _BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SandboxError(
            ErrorCode.SANDBOX_UNAVAILABLE,
            f"runtime.backend {name!r} cannot be loaded ({exc}); it needs {needs}",
            backend=name,
        ) from exc
    if name == "docker":
        backend: Backend = module.DockerBackend()
    elif name == "kubernetes":
        backend = module.KubernetesBackend(config)
    else:
        backend = module.HostBackend(config.state_dir)
    return backend


def host_shell(workspace: Path, pid_dir: Path, env: Mapping[str, str] | None = None) -> Shell:
    """The shell of sandbox mode `off`: commands on the host in the agent's own workspace. No
    backend is involved (runtime.backend may well be docker), so it is named here, with them."""
    module = importlib.import_module("sandbox.runtime.host.shell")
    shell: Shell = module.HostShell(workspace, pid_dir, env=env)
    return shell


def agent_files(
    link: Callable[[], Awaitable[AgentChannel]],
    roots: list[Root],
    fs: FsSection,
    states: SeenFiles,
    lock_dir: Path,
    quota: WorkspaceQuota | None,
    *,
    group_shared: bool,
) -> WorkspaceFiles:
    """The file tools' view of a workspace only the sandbox's resident agent reaches
    (`workspace_store: volume`): runtime/agent/files.py, loaded when a session first needs it."""
    module = importlib.import_module("sandbox.runtime.agent.files")
    files: WorkspaceFiles = module.AgentFiles(link, roots, fs, states, lock_dir, None, quota, group_shared=group_shared)
    return files
