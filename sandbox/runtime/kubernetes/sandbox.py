"""One sandbox Pod: the Shell primitives the tools use, all through its resident agent.

On a cluster every command goes through the agent over its `pods/exec` stream (one websocket
per agent, not one per command). There is no host /proc to kill from, so a call's processes are
signalled from inside, in three steps, each taken when the one before cannot be:
1. the agent's signal frame to the command's process group, and the kill by the call's tag
   (what left the group) run by the agent;
2. the same kill in a one-shot `pods/exec` of its own, without the agent (its link is gone);
3. deleting the Pod, when no kill can be confirmed: nothing of a timed-out call goes on.

Exec cannot choose a user under Pod Security `restricted`, so a shell here runs as the Pod's
user only; a session with a uid of its own (agent or shared scope with session users) has its
commands, kills and files sent to a Pod of its own, on the same workspace claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal as signals
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from sandbox._log import logger
from sandbox.errors import SandboxUnavailable
from sandbox.runtime import shellwrap
from sandbox.runtime.agent.link import AgentLink, AgentUnavailable
from sandbox.runtime.call_stop import run_then_stop, stop_confirmed
from sandbox.runtime.protocol import ArgvOptions, ExecResult, OneShot, RunRequest, argv_options
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.kubernetes.backend import KubernetesBackend

KILL_TIMEOUT_S = 15.0
KILL_NOT_CONFIRMED = (
    "the command's processes could not be confirmed dead, so the sandbox Pod was deleted "
    "(it is created afresh on next use; background processes in it are gone)"
)


class KubernetesSandbox(shellwrap.InSandbox):
    """One running sandbox Pod."""

    def __init__(self, backend: KubernetesBackend, name: str, spec: SandboxSpec) -> None:
        self._backend = backend
        self._name = name
        self._spec = spec
        self._revive: Callable[[], Awaitable[str]] | None = None
        self.gone = False
        self._sessions: dict[str, KubernetesSandbox] = {}  # a session user -> its own Pod

    @property
    def id(self) -> str:
        """The Pod's name (unique across the tenants' namespaces: it carries the tenant's hash)."""
        return self._name

    def set_reviver(self, revive: Callable[[], Awaitable[str]]) -> None:
        """How to get a fresh Pod when this one is found gone."""
        self._revive = revive

    async def _elsewhere(self, user: str | None) -> KubernetesSandbox | None:
        """The Pod that runs `user`'s commands when it is not this one: a session with a uid of
        its own has a Pod of its own (backend.session_pod); None for this Pod's own user."""
        if user is None or user == self._spec.user or not self._spec.session_users:
            return None  # another user without session users is refused by _link
        pod = self._sessions.get(user)
        if pod is None or pod.gone:
            pod = self._sessions[user] = await self._backend.session_pod(self._spec, user)
        return pod

    async def _link(self, user: str | None) -> AgentLink:
        if user is not None and user != self._spec.user:
            raise SandboxUnavailable(
                f"a command as user {user!r} cannot run in a Pod of user {self._spec.user!r} on Kubernetes "
                "(exec cannot choose a user under Pod Security restricted)"
            )
        link = await self._backend.agents.link(self._name, self._spec, None)
        if link is not None:
            self._backend.heartbeat(link)
        if link is None:
            raise SandboxUnavailable(
                f"the sandbox Pod {self._name} has no resident agent answering (its image must carry "
                "/usr/local/lib/sandbox-agent/agent.py, as the project's sandbox image does)"
            )
        return link

    async def run(self, request: RunRequest) -> ExecResult:
        """Run `request.command` (see the Shell protocol); a timeout or cancellation kills its work."""
        if (pod := await self._elsewhere(request.user)) is not None:
            return await pod.run(dataclasses.replace(request, user=None))
        environment = {**request.env, shellwrap.TAG_VAR: request.call_id}
        argv = shellwrap.wrapped_argv(request.command, request.call_id, request.pid_dir or shellwrap.PID_DIR)

        async def run() -> ExecResult:
            link = await self._link(request.user)
            return await link.run(
                argv,
                environment=environment,
                workdir=request.workdir,
                timeout_s=request.timeout_s,
                on_output=request.on_output,
                capture=request.capture,
                tag=request.call_id,
                pid_file=shellwrap.pid_file(request.call_id, request.pid_dir or shellwrap.PID_DIR),
                pid_dir_mode=shellwrap.pid_dir_mode(request.pid_dir or shellwrap.PID_DIR),
            )

        return await run_then_stop(
            run, lambda: self.stop(request.call_id, pid_dir=request.pid_dir), (AgentUnavailable,)
        )

    async def stop(self, call_id: str, *, pid_dir: str | None = None) -> str | None:
        """TERM, a grace period, then KILL everything `call_id` started, and confirm it; when it
        cannot be confirmed the Pod is deleted and the returned note says so."""

        async def remove() -> None:
            self.gone = True
            await self._backend.remove(self._name)

        return await stop_confirmed(
            lambda signal: self.kill(call_id, signal, pid_dir=pid_dir),
            lambda: self._kill(call_id, "KILL", pid_dir=pid_dir),
            remove,
            sandbox=self._name,
            call_id=call_id,
            note=KILL_NOT_CONFIRMED,
        )

    async def run_argv(self, argv: Sequence[str], **options: Unpack[ArgvOptions]) -> ExecResult:
        """Run an argv through the agent (helpers and probes)."""
        user, timeout_s, env = argv_options(options)
        if (pod := await self._elsewhere(user)) is not None:
            return await pod.run_argv(argv, timeout_s=timeout_s, env=env)
        link = await self._link(user)
        return await link.run(list(argv), environment=dict(env or {}), timeout_s=timeout_s)

    async def kill(
        self, call_id: str, signal: str = "KILL", *, user: str | None = None, pid_dir: str | None = None
    ) -> None:
        """Signal everything `call_id` started (see :meth:`stop` for a confirmed kill)."""
        if (pod := await self._elsewhere(user)) is not None:
            return await pod.kill(call_id, signal, pid_dir=pid_dir)
        await self._kill(call_id, signal, pid_dir=pid_dir)

    async def _kill(self, call_id: str, signal: str, *, pid_dir: str | None = None) -> bool:
        """Steps 1 and 2 of the module docstring; True when the signal was delivered (for KILL:
        and nothing tagged with `call_id` is left)."""
        shellwrap.check_call_id(call_id)
        argv = shellwrap.kill_argv(call_id, signal, pid_dir or shellwrap.PID_DIR)
        try:
            link = await self._link(None)
            with contextlib.suppress(AgentUnavailable):  # the tag kill below still reaches it
                await link.signal_tagged(call_id, int(signals.Signals[f"SIG{signal}"]))
            result = await link.run(argv, timeout_s=KILL_TIMEOUT_S)
            return result.exit_code == 0 and (signal != "KILL" or not await self.alive(call_id))
        except SandboxUnavailable as exc:  # the agent is gone, or cannot start: without it
            logger.bind(pod=self._name, call_id=call_id).warning("k8s_kill_without_agent", reason=exc.message)
        try:
            code, _ = await self._backend.exec_once(self._name, argv, KILL_TIMEOUT_S)
            if code != 0 or signal != "KILL":
                return code == 0
            code, out = await self._backend.exec_once(self._name, shellwrap.alive_argv(call_id), KILL_TIMEOUT_S)
            return code == 0 and not out.split()
        except SandboxUnavailable:
            return False

    async def end_user(self, user: str, *, remove: Sequence[str] = ()) -> bool:
        """End everything of `user` (see the protocol): a session user has a Pod of its own here
        (on the same workspace claim), which goes whole; never this Pod's own user."""
        if user == self._spec.user or not self._spec.session_users:
            raise ValueError(f"not a session's own user: {user!r}")
        self._sessions.pop(user, None)
        await self._backend.remove(self._backend.session_pod_name(self._spec, user))
        return True

    async def alive(self, call_id: str, *, user: str | None = None) -> list[int]:
        """Pids (in the Pod) still tagged with `call_id`."""
        if (pod := await self._elsewhere(user)) is not None:
            return await pod.alive(call_id)
        result = await self.run_argv(shellwrap.alive_argv(call_id), timeout_s=15)
        if result.exit_code != 0:
            raise SandboxUnavailable(f"cannot list the processes of call {call_id} in the sandbox Pod")
        return [int(p) for p in result.stdout.split()]

    async def agent_link(self, user: str | None = None) -> AgentLink:
        """The resident agent of this Pod (the file tools use it: the workspace is not on this host)."""
        if (pod := await self._elsewhere(user)) is not None:
            return await pod.agent_link()
        return await self._link(user)

    async def volume_folder(self) -> Path | None:
        """None: a claim has no folder on this host."""
        return None

    def one_shot(self) -> OneShot | None:
        """One-shot Pods beside this one, for skill calls (kubernetes/skill_run.py)."""
        from sandbox.runtime.kubernetes.skill_run import KubernetesOneShot

        return KubernetesOneShot(self._backend, self)
