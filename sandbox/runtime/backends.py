"""Choosing the sandbox backend by name (`runtime.backend`), importing it only when chosen."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.errors import ErrorCode, SandboxError

if TYPE_CHECKING:
    from sandbox.config.models import Config
    from sandbox.runtime.protocol import Backend, Shell

# name -> (module, what it needs installed)
_BACKENDS = {
    "docker": ("sandbox.runtime.docker.backend", "the docker SDK: pip install 'docker>=7.1'"),
    "host": ("sandbox.runtime.host.backend", "nothing"),
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
    else:
        backend = module.HostBackend(config.state_dir)
    return backend


def host_shell(workspace: Path, pid_dir: Path, env: Mapping[str, str] | None = None) -> Shell:
    """The shell of sandbox mode `off`: commands on the host in the agent's own workspace. No
    backend is involved (runtime.backend may well be docker), so it is named here, with them."""
    module = importlib.import_module("sandbox.runtime.host.shell")
    shell: Shell = module.HostShell(workspace, pid_dir, env=env)
    return shell
