"""A uid of its own for each session sharing an agent- or shared-scope container.

Sessions of one agent share its container. Under one uid, any of them could read another's
process environments (`/proc/*/environ`), signal its processes, and rewrite the output, stdin
fifo and exit status files of its background processes, so `process poll` would return what an
other session wrote. With session users, every command of a session runs as its own uid (group:
the sandbox user's group, so the workspace stays shared), and its process records live in a
directory only that uid can enter (`/tmp/.sbx-<uid>-<random>`, mode 700, checked to be owned by
it before it is trusted). The kernel then keeps sessions apart: environments, signals and files.

uids are allocated per container in the state dir, as an open-addressing table of small files
(`<registry>/<uid>` holds the session key and the random part of its directory name), created
atomically with `link`, so concurrent orchestrators never hand one uid to two sessions. Service
replicas on a shared store allocate there instead (:func:`allocate_shared`, the same probing),
since each replica has a state dir of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from sandbox.errors import ErrorCode, SandboxError
from sandbox.runtime.naming import tenant_scope

if TYPE_CHECKING:  # spec.py imports this module; the protocol imports spec.py
    from typing import Unpack

    from sandbox.runtime.protocol import AgentChannel, ArgvOptions, ExecResult, OneShot, RunRequest, Sandbox
    from sandbox.runtime.spec import SandboxSpec
    from sandbox.state.protocol import SessionUids

UID_BASE = 20000
# up to 65535: an engine with userns-remap maps 65536 ids per container, no more
UID_SPAN = 65536 - UID_BASE
MAX_PROBES = 256
UMASK = "002"  # what one session makes, the agent's other sessions (same group) can change
SESSION_ENV = {
    "SBX_UMASK": UMASK,
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
}


def uses_session_users(setting: str, scope: str, workspace_access: str, user: str) -> bool:
    """Whether sessions get uids of their own.

    `auto` turns them on where sessions share a container (agent or shared scope) and the
    workspace is not the user's own writable folder: there, files made by a session would be
    owned on the host by a uid nobody has, in folders the sandbox group may not write.
    `on` forces them (the workspace must be group-writable for the sandbox user's group);
    a non-numeric sandbox user (`docker.user: name`) has no group id to share, so never.
    """
    uid, _, gid = user.partition(":")
    if not (uid.isdigit() and (gid or uid).isdigit()):
        return False
    if setting == "on":
        return True
    return setting == "auto" and scope != "session" and workspace_access != "rw"


@dataclass(frozen=True)
class SessionUser:
    """The uid a session runs as in its container, and where its process records live."""

    uid: int
    gid: int
    token: str

    @property
    def user(self) -> str:
        """`uid:gid` for the engine's exec."""
        return f"{self.uid}:{self.gid}"

    def pid_dir(self, container_id: str) -> str:
        """The session's private record directory in one container's /tmp.

        Derived from the secret token and the container: after a sandbox is recreated the name
        is new, so nobody who saw the old one in `ls /tmp` can create it first.
        """
        tag = hashlib.sha256(f"{self.token}|{container_id}".encode()).hexdigest()[:16]
        return f"/tmp/.sbx-{self.uid}-{tag}"


def _first_probe(session: str) -> int:
    return int.from_bytes(hashlib.sha256(session.encode()).digest()[:8], "big") % UID_SPAN


def _exhausted(where: str) -> SandboxError:
    return SandboxError(
        ErrorCode.SANDBOX_UNAVAILABLE,
        f"no free session uid for this sandbox after {MAX_PROBES} tries: about {UID_SPAN:,} sessions "
        f"have used it; remove the sandbox and its registry ({where}) or use scope: session",
    )


async def allocate_shared(store: SessionUids, spec: Any, session: str) -> SessionUser:
    """The session's uid in the container of `spec`, from the shared store (replicas agree).

    Raises:
        SandboxError: SANDBOX_UNAVAILABLE when no free uid is found near the session's hash;
            SERVICE_UNAVAILABLE when the store does not answer.
    """
    gid = session_gid(spec)
    scope = uid_scope(spec)
    found = await store.session_uid(scope, session)
    if found is not None:
        return SessionUser(found[0], gid, found[1])
    for uid in _probes(session, own_uid(spec)):
        holder = await store.claim_uid(scope, uid, session, secrets.token_hex(8))
        if holder is None:  # this session took another uid meanwhile (another replica)
            again = await store.session_uid(scope, session)
            if again is not None:
                return SessionUser(again[0], gid, again[1])
            continue
        if holder[0] == session:
            return SessionUser(uid, gid, holder[1])
    raise _exhausted(f"the shared store's uids of {scope}")


class SharedUids:
    """Session uids from the shared store, remembered: a session's uid in a container never
    changes (uids are never reused), so each is asked for once per process."""

    MAX_KNOWN = 100_000

    def __init__(self, store: SessionUids) -> None:
        self.store = store
        self._known: dict[tuple[str, str, str], SessionUser] = {}

    async def user(self, spec: Any, session: str) -> SessionUser:
        """The session's uid in the container of `spec` (see :func:`allocate_shared`)."""
        key = (uid_scope(spec), spec.user, session)
        found = self._known.get(key)
        if found is None:
            found = await allocate_shared(self.store, spec, session)
            if len(self._known) >= self.MAX_KNOWN:
                self._known.clear()  # asked again at need: the store has them all
            self._known[key] = found
        return found


def _probes(session: str, avoid: int | None) -> Iterator[int]:
    """The uids a session's search visits, in order (never `avoid`: the sandbox's own user,
    whose processes are the container's and every session-less command's)."""
    start = _first_probe(session)
    for probe in range(MAX_PROBES):
        uid = UID_BASE + (start + probe) % UID_SPAN
        if uid != avoid:
            yield uid


def allocate(registry: Path, session: str, gid: int, avoid: int | None = None) -> SessionUser:
    """The session's uid in one container: found when allocated before, else claimed.

    Raises:
        SandboxError: SANDBOX_UNAVAILABLE when no free uid is found near the session's hash
            (tens of thousands of sessions in one container; uids are never reused).
    """
    registry.mkdir(parents=True, exist_ok=True, mode=0o700)
    for uid in _probes(session, avoid):
        entry = registry / str(uid)
        found = _read(entry)
        if found is None:
            found = _claim(registry, entry, session)
        if found[0] == session:
            return SessionUser(uid, gid, found[1])
    raise _exhausted(str(registry))


def find(registry: Path, session: str, gid: int, avoid: int | None = None) -> SessionUser | None:
    """The session's uid in one container if it was ever given one; nothing is claimed."""
    for uid in _probes(session, avoid):
        found = _read(registry / str(uid))
        if found is None:
            return None  # the search would have claimed this one: the session never got a uid
        if found[0] == session:
            return SessionUser(uid, gid, found[1])
    return None


def own_uid(spec: Any) -> int | None:
    """The uid of the sandbox's own user (`uid[:gid]`); None for a user given by name."""
    uid = spec.user.partition(":")[0]
    return int(uid) if uid.isdigit() else None


def session_gid(spec: Any) -> int:
    """The group every session user of `spec`'s sandbox has: the sandbox user's (`uid[:gid]`)."""
    return int(spec.user.partition(":")[2] or spec.user)


async def known_user(spec: Any, session: str, registry_root: Path, shared: SharedUids | None) -> SessionUser | None:
    """The session's uid in `spec`'s sandbox if it was ever given one (the shared store's, else
    this state dir's registry); nothing is allocated (a close must not)."""
    if shared is not None:
        found = await shared.store.session_uid(uid_scope(spec), session)
        return SessionUser(found[0], session_gid(spec), found[1]) if found is not None else None
    registry = registry_of(registry_root, spec)
    return await anyio.to_thread.run_sync(find, registry, session, session_gid(spec), own_uid(spec))


def _read(entry: Path) -> tuple[str, str] | None:
    try:
        data = json.loads(entry.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        return ("", "")  # unreadable: taken, by nobody we know
    return str(data.get("session", "")), str(data.get("token", ""))


def _claim(registry: Path, entry: Path, session: str) -> tuple[str, str]:
    """Create `entry` for `session` whole or not at all; return whoever holds it afterwards."""
    token = secrets.token_hex(8)
    tmp = registry / f".{entry.name}.{secrets.token_hex(4)}.tmp"
    tmp.write_text(json.dumps({"session": session, "token": token}))
    try:
        os.link(tmp, entry)  # atomic, and fails when a concurrent claim won
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return _read(entry) or ("", "")


class SessionShell:
    """A session's view of a shared sandbox: every command runs as the session's own uid.

    It is the Shell the session's tools get; the sandbox itself (for skills, explain) is
    :attr:`sandbox`.
    """

    def __init__(self, sandbox: Sandbox, user: SessionUser) -> None:
        self.sandbox = sandbox
        self.session_user = user

    @property
    def pid_dir(self) -> str:
        """The session's private record directory (in the sandbox's current container)."""
        return self.session_user.pid_dir(self.sandbox.id)

    @property
    def tmp_dir(self) -> str | None:
        """The session's TMPDIR: inside its private directory, so no other session can squat it."""
        return f"{self.pid_dir}/tmp"

    @property
    def durable_processes(self) -> bool:
        """The sandbox's answer."""
        return self.sandbox.durable_processes

    @property
    def spec(self) -> SandboxSpec:
        """The sandbox's spec."""
        return self.sandbox.spec

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return self.sandbox.id

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        # git refuses repositories another uid owns ("dubious ownership"); sessions share the
        # workspace on purpose (README: what sessions of one agent share)
        return {**SESSION_ENV, **(env or {})}

    async def run(self, request: RunRequest) -> ExecResult:
        """Run `request.command` as the session's uid, its pid file in the session's directory."""
        return await self.sandbox.run(
            dataclasses.replace(
                request,
                env=self._env(request.env),
                user=request.user or self.session_user.user,
                pid_dir=request.pid_dir or self.pid_dir,
            )
        )

    async def run_argv(self, argv: Sequence[str], **options: Unpack[ArgvOptions]) -> ExecResult:
        """Run an argv as the session's uid."""
        return await self.sandbox.run_argv(
            argv,
            user=options.get("user") or self.session_user.user,
            timeout_s=options.get("timeout_s", 30.0),
            env=self._env(options.get("env")),
        )

    async def kill(
        self, call_id: str, signal: str = "KILL", *, user: str | None = None, pid_dir: str | None = None
    ) -> None:
        """Signal what `call_id` started (from the host; inside, as the session's uid, its own pid files)."""
        await self.sandbox.kill(call_id, signal, user=user or self.session_user.user, pid_dir=pid_dir or self.pid_dir)

    async def alive(self, call_id: str, *, user: str | None = None) -> list[int]:
        """Pids `call_id` started that are still alive."""
        return await self.sandbox.alive(call_id, user=user or self.session_user.user)

    async def end_processes(self) -> bool:
        """KILL everything the session's uid runs in the sandbox (the session is closing: what
        it left running in the background, `setsid` or not, must not outlive it in a container
        other sessions share). True when nothing of it is known to be left."""
        # its record folder (and TMPDIR in it) and what else it left in that /tmp
        return await self.sandbox.end_user(self.session_user.user, remove=(posixpath.dirname(self.pid_dir),))

    async def agent_link(self, user: str | None = None) -> AgentChannel | None:
        """The session uid's own resident agent (never another session's)."""
        return await self.sandbox.agent_link(user or self.session_user.user)

    async def volume_folder(self) -> Path | None:
        """The host folder of the sandbox's workspace volume, if it has one here."""
        return await self.sandbox.volume_folder()

    def one_shot(self) -> OneShot | None:
        """One-shot sandboxes on the shared sandbox's engine."""
        return self.sandbox.one_shot()


def session_shell(sandbox: Sandbox, registry_root: Path, session: str) -> Sandbox | SessionShell:
    """The Shell a session's tools use: its own-uid view when the spec asks for session users."""
    spec = sandbox.spec
    if not spec.session_users:
        return sandbox
    return SessionShell(sandbox, allocate(registry_of(registry_root, spec), session, session_gid(spec), own_uid(spec)))


def still_held(registry_root: Path, spec: Any, session: str, user: SessionUser) -> bool:
    """Whether the registry still gives `user`'s uid to `session` (a small file read: a cached
    uid is checked before each use, so a registry removed by hand never leaves two sessions on
    one uid)."""
    found = _read(registry_of(registry_root, spec) / str(user.uid))
    return found is not None and found == (session, user.token)


def registry_of(registry_root: Path, spec: Any) -> Path:
    """The uid registry of one container (its tenant and scope key; config changes keep it)."""
    return registry_root / uid_scope(spec)


def uid_scope(spec: Any) -> str:
    """The key of one container's uids: its tenant and scope key, hashed (config changes keep it)."""
    return hashlib.sha256(tenant_scope(spec.tenant, spec.scope_key).encode()).hexdigest()[:32]
