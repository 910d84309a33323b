"""A skill's one-shot container on the Docker engine (the `Sandbox.one_shot` capability): made for
one call from the spec runtime/skill_spec.py builds, the command run in it (no shell), and removed
whatever happens, so a timeout kills everything the handler started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from docker.types import Mount as DockerMount

from sandbox.runtime.docker.create import create_container, create_kwargs
from sandbox.runtime.docker.exec import exec_stream
from sandbox.runtime.output import OutputCapture
from sandbox.runtime.protocol import ExecResult
from sandbox.runtime.skill_spec import MAX_OUTPUT, SkillCall, skill_mounts, skill_spec_for, verified, verify_argv
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.docker.backend import DockerBackend

VERIFY_TIMEOUT_S = 30.0
LIFETIME_GRACE_S = 60  # the container's `sleep` outlives the call by this, then it exits by itself


async def run_in_container(
    backend: DockerBackend,
    spec: SandboxSpec,
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout_s: float,
) -> ExecResult:
    """Create the skill's container, run `argv` in it (no shell), and remove it whatever happens."""
    kwargs: dict[str, Any] = create_kwargs(spec)
    # the container ends by itself even if this process dies mid-call
    kwargs["command"] = ["sleep", str(int(timeout_s) + LIFETIME_GRACE_S)]
    kwargs["mounts"] = [
        DockerMount(m.target, m.source, type="bind", read_only=m.read_only, propagation="rprivate") for m in spec.mounts
    ]

    def create_and_start() -> str:
        container = create_container(backend.client, kwargs)
        try:
            container.start()
        except Exception:
            container.remove(force=True)
            raise
        return str(container.id)

    container_id = await backend.call("create skill sandbox", create_and_start)
    try:
        expected = {m.target: m.identity for m in spec.mounts if m.identity is not None}
        if expected:  # before the handler: each declared path is the folder that was checked
            check = await exec_stream(
                backend, container_id, verify_argv(expected), user=spec.user, timeout_s=VERIFY_TIMEOUT_S
            )
            verified(check)
        return await exec_stream(
            backend,
            container_id,
            list(argv),
            environment=dict(env),
            workdir="/workspace",
            user=spec.user,
            timeout_s=timeout_s,
            capture=OutputCapture(max_bytes=MAX_OUTPUT),
        )
    finally:
        with anyio.CancelScope(shield=True):
            await backend.remove(container_id)


class DockerOneShot:
    """One-shot containers on a session's engine (the skill's container goes on the same one)."""

    def __init__(self, backend: DockerBackend) -> None:
        self._backend = backend

    async def run(
        self, session: SandboxSpec, call: SkillCall, argv: Sequence[str], env: Mapping[str, str], timeout_s: float
    ) -> ExecResult:
        """The call's container (its folder and declared paths bind-mounted: skill_spec.skill_mounts),
        by :func:`run_in_container` on this backend."""
        mounts = skill_mounts(session, call.folder, call.read, call.write)
        spec = skill_spec_for(session, call.skill, mounts, network=call.network, call_id=call.call_id)
        return await run_in_container(self._backend, spec, argv, env, timeout_s)
