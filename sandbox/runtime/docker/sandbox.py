"""One live exec sandbox: the Shell primitives the tools use, bound to a container."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import anyio
import anyio.to_thread

from sandbox._log import logger
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.runtime import shellwrap
from sandbox.runtime.agent.link import AgentLink, AgentUnavailable
from sandbox.runtime.call_stop import run_then_stop, stop_confirmed
from sandbox.runtime.docker import kill as docker_kill
from sandbox.runtime.docker import workspace as docker_workspace
from sandbox.runtime.docker.exec import SandboxGone, SandboxStopped, exec_stream, stopped
from sandbox.runtime.docker.skill_run import DockerOneShot
from sandbox.runtime.protocol import ArgvOptions, ExecResult, RunRequest, argv_options
from sandbox.runtime.spec import SandboxSpec

KILL_NOT_CONFIRMED = (
    "the command's processes could not be confirmed dead, so the sandbox was removed "
    "(it is created afresh on next use; background processes in it are gone)"
)

if TYPE_CHECKING:
    from sandbox.runtime.docker.backend import DockerBackend


# counts the caller's own processes but itself, with shell builtins only (no fork: the pids limit
# may be full); /proc lists at least those, with or without hidepid
OWN_LEFT = 'n=0; for d in /proc/[0-9]*; do [ "$d" = "/proc/$$" ] || { [ -O "$d" ] && n=$((n+1)); }; done; echo $n'


class DockerSandbox(shellwrap.InSandbox):
    """One running exec sandbox container."""

    def __init__(
        self,
        backend: DockerBackend,
        container_id: str,
        spec: SandboxSpec,
        revive: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self._backend = backend
        self._id = container_id
        self._spec = spec
        self._revive = revive
        self.gone = False  # set when the engine says the container is gone or stopped

    @property
    def backend(self) -> DockerBackend:
        """The backend this sandbox lives on (skill containers go on the same engine)."""
        return self._backend

    @property
    def id(self) -> str:
        """The container id."""
        return self._id

    def set_reviver(self, revive: Callable[[], Awaitable[str]]) -> None:
        """How to get a fresh container when this one is found gone."""
        self._revive = revive

    async def run(self, request: RunRequest) -> ExecResult:
        """Run `request.command` (see :class:`~sandbox.runtime.protocol.Shell`)."""
        call_id, user, pid_dir = request.call_id, request.user, request.pid_dir
        environment = {**request.env, shellwrap.TAG_VAR: call_id}
        argv = shellwrap.wrapped_argv(request.command, call_id, pid_dir or shellwrap.PID_DIR)

        async def run() -> ExecResult:
            return await self._exec(
                argv,
                environment=environment,
                workdir=request.workdir,
                user=user,
                timeout_s=request.timeout_s,
                on_output=request.on_output,
                capture=request.capture,
                pid_file=shellwrap.pid_file(call_id, pid_dir or shellwrap.PID_DIR),
                pid_dir_mode=shellwrap.pid_dir_mode(pid_dir or shellwrap.PID_DIR),
            )

        # the caller gave up, the agent that ran it died, or it outlived its bounds: the work dies
        return await run_then_stop(run, lambda: self.stop(call_id, user=user, pid_dir=pid_dir), (AgentUnavailable,))

    async def stop(self, call_id: str, *, user: str | None = None, pid_dir: str | None = None) -> str | None:
        """TERM, a grace period, then KILL everything `call_id` started, and confirm it.

        Returns None when confirmed; otherwise the sandbox is removed (so nothing of the call can
        go on) and the returned note says so.
        """

        async def remove() -> None:
            self.gone = True
            await self._backend.remove(self._id)

        return await stop_confirmed(
            lambda signal: self.kill(call_id, signal, user=user, pid_dir=pid_dir),
            lambda: self._kill(call_id, "KILL", user=user, pid_dir=pid_dir),
            remove,
            sandbox=self._spec.name,
            call_id=call_id,
            note=KILL_NOT_CONFIRMED,
        )

    async def run_argv(self, argv: Sequence[str], **options: Unpack[ArgvOptions]) -> ExecResult:
        """Run an argv directly (helpers and probes)."""
        user, timeout_s, env = argv_options(options)
        return await self._exec(list(argv), user=user, timeout_s=timeout_s, environment=dict(env) if env else None)

    async def _exec(self, argv: list[str], **kwargs: Any) -> ExecResult:
        try:
            await self._check_workspace()
            return await self._exec_once(argv, **kwargs)
        except SandboxGone:
            # Nothing ran yet (the exec was never created), so trying once more in a fresh
            # container cannot run the command twice.
            self.gone = True
            if self._revive is None:
                raise
            self._id = await self._revive()
            self.gone = False
            return await self._exec_once(argv, **kwargs)
        except AgentUnavailable:
            raise  # the agent failed, not the container: the sandbox is kept
        except SandboxUnavailable:
            self.gone = True
            raise

    async def _check_workspace(self) -> None:
        """SandboxGone when the workspace folder it was made on was removed on the host (nothing
        can start in it; see runtime/docker/workspace.py): it is made again by the reviver."""
        recorded = await docker_workspace.recorded_for(self._backend, self._id)
        if docker_workspace.workspace_lost(recorded, self._spec):
            logger.bind(container=self._spec.name, workspace=self._spec.mounts[0].source).warning(
                "sandbox_workspace_gone"
            )
            raise SandboxGone(docker_workspace.lost_message(self._spec))

    async def _exec_once(self, argv: list[str], **kwargs: Any) -> ExecResult:
        link = await self._backend.agents.link(self._id, self._spec, kwargs.get("user"))
        if link is None:
            # docker exec: the file stays (only the agent removes it, at no cost), and the wrapper
            # makes its folder
            kwargs.pop("pid_file", None)
            kwargs.pop("pid_dir_mode", None)
            return await exec_stream(self._backend, self._id, argv, **kwargs)
        kwargs.pop("user", None)  # the link runs as its user
        try:
            return await link.run(argv, **kwargs)
        except AgentUnavailable:
            if await self._stopped():
                raise SandboxUnavailable(
                    "the sandbox container stopped during the call; it is recreated on next use"
                ) from None
            raise

    async def _stopped(self) -> bool:
        """Whether the container stopped under its agent. The engine may still say it runs (its
        shim just died), so when it does, a `true` is started beside: only a live container runs
        it. Paused (a kill's freeze) is not stopped, and an engine that fails says nothing."""
        attrs = await self._backend.find(self._id)
        if stopped(attrs):
            return True
        if attrs is None or attrs["State"].get("Status") != "running":
            return False
        try:
            await exec_stream(self._backend, self._id, ["true"], timeout_s=15)
        except (SandboxGone, SandboxStopped):
            return True
        except SandboxError:
            return False
        return False

    async def kill(
        self, call_id: str, signal: str = "KILL", *, user: str | None = None, pid_dir: str | None = None
    ) -> None:
        """Signal everything `call_id` started (see :meth:`stop` for a confirmed kill)."""
        await self._kill(call_id, signal, user=user, pid_dir=pid_dir)

    async def _kill(self, call_id: str, signal: str, *, user: str | None, pid_dir: str | None = None) -> bool:
        # From the host first: it needs no new process in the sandbox (whose pids limit may be
        # used up) and no engine exec round trip. Then from inside, when the host cannot see.
        api = self._backend.client.api
        shellwrap.check_call_id(call_id)
        confirmed = await self._backend.call("kill", docker_kill.kill_call, api, self._id, call_id, signal)
        if confirmed is not None:
            return confirmed
        try:
            argv = shellwrap.kill_argv(call_id, signal, pid_dir or shellwrap.PID_DIR)
            result = await self._exec(argv, user=user or self._spec.user, timeout_s=15)
            if result.exit_code != 0:
                return False
            return signal != "KILL" or not await self.alive(call_id, user=user)
        except SandboxUnavailable:
            return False

    async def agent_link(self, user: str | None = None) -> AgentLink:
        """The resident agent of this sandbox for `user` (started when needed).

        Raises:
            SandboxUnavailable: the sandbox runs commands by docker exec (the reason is said).
        """
        link = await self._backend.agents.link(self._id, self._spec, user)
        if link is None:
            path = await self._backend.agents.exec_path(self._spec, self._id, user or self._spec.user)
            raise SandboxUnavailable(f"this sandbox has no resident agent: {path.describe()}")
        return link

    def one_shot(self) -> DockerOneShot:
        """One-shot containers on this sandbox's engine (runtime/docker/skill_run.py)."""
        return DockerOneShot(self._backend)

    async def volume_folder(self) -> Path | None:
        """The host folder of the workspace volume, when the engine keeps it on this host (a
        local engine); None for a remote engine or a workspace that is not a volume."""
        mount = self._spec.mounts[0]
        if not mount.volume:
            return None
        found = await self._backend.call(
            "inspect workspace volume", self._backend.client.api.inspect_volume, mount.source
        )
        folder = Path(str(found.get("Mountpoint", "")))
        return folder if await anyio.to_thread.run_sync(folder.is_dir) else None

    async def end_user(self, user: str, *, remove: Sequence[str] = ()) -> bool:
        """KILL every process of `user` here (see the protocol): from the host first, which needs
        no new process in a sandbox whose pids limit the user may have used up; else from inside,
        as that user (`kill -9 -1` reaches exactly what the user may signal: its own). Then its
        entries at the top of each `remove` folder go, as that user (the sandbox's root has no
        capability to)."""
        uid = user.partition(":")[0]
        if not uid.isdigit() or int(uid) == 0 or uid == self._spec.user.partition(":")[0]:
            raise ValueError(f"not a session's own user: {user!r}")  # never root or the sandbox's user
        ended = await self._end_processes(user, uid)
        if remove:
            with contextlib.suppress(SandboxError):  # a sandbox gone or stuck: its /tmp goes with it
                # plain docker exec (an agent of the user's would outlive the close)
                await exec_stream(self._backend, self._id, shellwrap.clean_user_argv(remove), user=user, timeout_s=15)
        return ended

    async def _end_processes(self, user: str, uid: str) -> bool:
        self._backend.agents.close(self._id, user)  # its agent goes with the rest
        api = self._backend.client.api
        confirmed = await self._backend.call("end user", docker_kill.kill_user, api, self._id, int(uid))
        if confirmed is not None:
            return confirmed
        # plain docker exec, not an agent (this would kill it), and never a revived container
        try:
            # 0: signalled, 1: nothing to signal; anything else (126, 127, a timeout): it never ran
            killed = await exec_stream(
                self._backend, self._id, ["/bin/sh", "-c", "kill -9 -1"], user=user, timeout_s=15
            )
            if killed.exit_code not in (0, 1):
                return False
            for attempt in range(5):  # the killed take a moment to be reaped (a zombie is still listed)
                # what of the user's is left but this shell (`kill -0 -1` cannot say: it succeeds
                # whenever the container has any other process, even one it may not signal)
                left = await exec_stream(self._backend, self._id, ["/bin/sh", "-c", OWN_LEFT], user=user, timeout_s=15)
                if left.exit_code == 0 and left.stdout.strip() == b"0":
                    return True
                await anyio.sleep(0.05 * 2**attempt)
        except SandboxGone:
            # gone, with everything in it; or paused (another kill froze it), which says nothing
            return await self._backend.find(self._id) is None
        except SandboxUnavailable:
            return False
        return False

    async def alive(self, call_id: str, *, user: str | None = None) -> list[int]:
        """Pids still tagged with `call_id` (host pids when the host can see them)."""
        api = self._backend.client.api
        members = await self._backend.call("list call", docker_kill.call_members, api, self._id, call_id)
        if members.visible:
            return list(members.pids)
        result = await self._exec(shellwrap.alive_argv(call_id), user=user or self._spec.user, timeout_s=15)
        if result.exit_code != 0:
            raise SandboxUnavailable(f"cannot list the processes of call {call_id} in the sandbox")
        return [int(p) for p in result.stdout.split()]
