"""The docker SDK client the backend uses, with a bound on how long the engine may take to answer.

docker-py waits 60 s for each answer by default; an engine that accepts connections but never
answers (a hung dockerd) then holds a call for minutes, one request after another. Control calls
(inspect, create, start, remove, ...) get :data:`CONTROL_TIMEOUT_S` instead, after which the call
fails with SANDBOX_UNAVAILABLE. Exec output streams are not bounded by it: docker-py polls their
socket without a timeout, so a silent command runs as long as it is allowed.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import docker

from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.runtime.docker.errors import mapped

CONTROL_TIMEOUT_S = 15.0


def connect(timeout_s: float) -> Any:
    """A client from the environment (DOCKER_HOST, ...) whose requests wait `timeout_s` at most.

    Raises:
        SandboxUnavailable: the engine is unreachable, misconfigured or does not answer.
    """
    failure: SandboxError | None = None
    try:
        with mapped("connect"):
            client = docker.from_env(timeout=timeout_s)
        if client.api.base_url.startswith("http+docker://"):  # a local socket: no HTTP proxy applies
            # requests would read the proxy variables of the environment on every call (0.2 ms)
            client.api.trust_env = False
        return client
    except SandboxError as exc:
        failure = SandboxUnavailable(exc.message, **exc.details)
    # outside `except`: nothing holds the half-made client now
    _collect_half_made_client()
    raise failure


def _collect_half_made_client() -> None:
    # docker.from_env() asks the engine for its API version while it is built; when that fails
    # the SDK drops its half-made client with the socket it opened still open. Collect it now,
    # quietly, rather than let the garbage collector warn later in some unrelated place.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
