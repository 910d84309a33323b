"""The narrow async protocol between tools and whatever runs them (Docker, the host, later k8s)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Unpack

from sandbox.runtime.naming import Labels
from sandbox.runtime.output import Captured, OutputCapture
from sandbox.runtime.spec import Mount, SandboxSpec

if TYPE_CHECKING:
    from sandbox.config.merge import EffectiveAgent
    from sandbox.journal.store import Journal
    from sandbox.runtime.manager import SandboxManager
    from sandbox.runtime.skill_spec import SkillCall


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command. A non-zero exit code is data, not an exception."""

    exit_code: int | None  # None when the command was killed on timeout
    stdout: bytes
    stderr: bytes
    output: bytes  # stdout and stderr interleaved in arrival order
    duration_ms: float
    timed_out: bool = False
    # what was kept of each stream (0 interleaved, 1 stdout, 2 stderr) when some was cut
    kept: Mapping[int, Captured] = field(default_factory=dict)
    full_output_path: str | None = None  # host file with the whole output, when it outgrew memory
    overflowed: bool = False  # output passed the capture's max_bytes; the command was stopped
    notes: tuple[str, ...] = ()  # things the caller must be told (a kill not confirmed, ...)

    @classmethod
    def from_capture(
        cls, capture: OutputCapture, *, exit_code: int | None, duration_ms: float, timed_out: bool
    ) -> ExecResult:
        """The result of a command whose output went through `capture`."""
        capture.close()
        kept = {which: capture.stream(which) for which in (0, 1, 2)}
        notes = (capture.spill_error,) if capture.spill_error else ()
        return cls(
            exit_code=exit_code,
            stdout=capture.joined(1),
            stderr=capture.joined(2),
            output=capture.joined(0),
            duration_ms=duration_ms,
            timed_out=timed_out,
            kept={k: v for k, v in kept.items() if v.cut},
            full_output_path=str(capture.spill_path) if capture.spilled else None,
            overflowed=capture.overflowed,
            notes=notes,
        )


@dataclass(frozen=True)
class RunRequest:
    """One command for :meth:`Shell.run`: every shell takes this one shape, every caller builds it.

    `call_id` tags every process the command starts (a timeout or cancellation kills them by
    it); `env` adds to the shell's environment; `pid_dir` overrides where its pid file goes (a
    session's private directory). `on_output` gets each chunk of output as it arrives (for
    progress events). `capture` bounds what is kept in memory and where the rest goes; when its
    maximum is passed the command is killed like on a timeout (`overflowed`). Without one,
    memory stays bounded and the middle of a long output is dropped.
    """

    command: str
    _: KW_ONLY
    call_id: str
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None  # None: the shell's working directory
    timeout_s: float | None = None  # None: no limit
    user: str | None = None  # None: the shell's user
    on_output: Callable[[bytes], None] | None = None
    capture: OutputCapture | None = None
    pid_dir: str | None = None  # None: the shell's own (Shell.pid_dir)


class ArgvOptions(TypedDict, total=False):
    """How :meth:`Shell.run_argv` runs an argv: as `user` (None: the shell's), within `timeout_s`
    (30 s when not given), with `env` added to its environment."""

    user: str | None
    timeout_s: float
    env: Mapping[str, str] | None


def argv_options(options: ArgvOptions) -> tuple[str | None, float, Mapping[str, str] | None]:
    """(user, timeout_s, env) of `options`, the defaults filled in."""
    return options.get("user"), options.get("timeout_s", 30.0), options.get("env")


@dataclass(frozen=True)
class SandboxInfo:
    """One live sandbox as the engine reports it (from its labels and state)."""

    id: str
    name: str
    kind: str
    instance: str
    tenant: str
    agent: str
    scope: str
    scope_key: str
    session: str
    config_hash: str
    created_at: str
    status: str
    image: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        """Whether the container is running."""
        return self.status == "running"

    @classmethod
    def from_spec(cls, spec: SandboxSpec, *, created_at: str, status: str = "running") -> SandboxInfo:
        """What a backend that keeps its sandboxes in memory reports about one of them."""
        return cls(
            id=spec.name,
            name=spec.name,
            kind="exec",
            instance=spec.instance,
            tenant=spec.tenant,
            agent=spec.agent,
            scope=spec.scope,
            scope_key=spec.scope_key,
            session=spec.session if spec.scope == "session" else "",
            config_hash=spec.config_hash,
            created_at=created_at,
            status=status,
            image=spec.image,
        )


def pool_member(info: SandboxInfo) -> bool:
    """Whether a listed sandbox was made for a warm pool (claimed or not)."""
    return bool(info.labels.get(Labels.POOL))


def under_pool_name(info: SandboxInfo) -> bool:
    """Still under its pool name: never handed out (a hand-over renames it to its session's
    sandbox). Unlike :func:`unclaimed`, true for every process that lists it, whichever handed it out."""
    return pool_member(info) and info.name.startswith(f"sbx-{info.instance}-pool-")


def unclaimed(info: SandboxInfo) -> bool:
    """A pool sandbox no session has yet (it counts against no tenant's quota)."""
    return pool_member(info) and info.scope == "pool"


class Shell(Protocol):
    """Run commands in one sandbox (or on the host): all the tools need to run things."""

    @property
    def pid_dir(self) -> str:
        """Where pid files and background output live."""
        ...

    @property
    def tmp_dir(self) -> str | None:
        """A TMPDIR private to this shell's session, when it has one (a session user's); None
        lets the tools choose a per-session path."""
        ...

    @property
    def durable_processes(self) -> bool:
        """Whether a command started detached (the process tool's, shellwrap's background start)
        runs on when this process goes, and can be found again by its id: a durable exec then
        runs as one (tools/handlers/durable.py); else as a plain command."""
        ...

    async def run(self, request: RunRequest) -> ExecResult:
        """Run `request.command` with /bin/sh -lc; on timeout (or cancellation) kill its whole
        process group. What each field asks is said on :class:`RunRequest`."""
        ...

    async def run_argv(self, argv: Sequence[str], **options: Unpack[ArgvOptions]) -> ExecResult:
        """Run an argv directly (helpers, probes); no kill tracking. See :class:`ArgvOptions`."""
        ...

    async def kill(
        self, call_id: str, signal: str = "KILL", *, user: str | None = None, pid_dir: str | None = None
    ) -> None:
        """Signal every process a call started (its group and anything tagged with its id).

        `pid_dir`: where the call's pid file is (a session's private directory), when not the default.
        """
        ...


class AgentChannel(Protocol):
    """A sandbox's resident agent as the file tools use it (fs/agent_files.py); the Docker
    backend's is `runtime.agent.link.AgentLink`."""

    async def file_request(
        self, header: dict[str, Any], chunks: Sequence[bytes] = (b"",), *, data_limit: int = 0
    ) -> tuple[Any, bytes]:
        """One file operation: the request, then what the agent sent back and its answer frame."""
        ...

    async def run(self, argv: Sequence[str], *, timeout_s: float | None = None) -> ExecResult:
        """Run argv in the sandbox through the agent (file listings: `find -P`)."""
        ...

    async def open_port(self, port: int) -> PortStream:
        """A connection to `port` on the sandbox's own loopback (previews); PortUnreachable
        when nothing of this user's listens there."""
        ...


class PortStream(Protocol):
    """One connection to a sandbox's loopback port, carried by its agent (runtime/agent/ports.py)."""

    async def read(self, max_bytes: int = ...) -> bytes:
        """What the server sent next; b"" once it closed its side."""
        ...

    async def write(self, data: bytes) -> None:
        """Send `data` to the server (waits while the agent's window is full)."""
        ...

    async def aclose(self) -> None:
        """Close the connection (twice is fine)."""
        ...


class OneShot(Protocol):
    """Sandboxes made for one skill call and removed after it (a capability: `Sandbox.one_shot`)."""

    async def run(
        self, session: SandboxSpec, call: SkillCall, argv: Sequence[str], env: Mapping[str, str], timeout_s: float
    ) -> ExecResult:
        """Make a sandbox for `call` with `session`'s hardening that holds the skill's folder
        read-only at /opt/skill and only the paths the skill declares (runtime/skill_spec.py), run
        `argv` in it (no shell), and remove it whatever happens."""
        ...


class Sandbox(Shell, Protocol):
    """A live sandbox: identity plus the primitives tools use."""

    @property
    def id(self) -> str:
        """The engine's id of the sandbox."""
        ...

    @property
    def spec(self) -> SandboxSpec:
        """The spec it was made from."""
        ...

    @property
    def gone(self) -> bool:
        """Whether the backend found it gone or stopped (it is replaced on next use)."""
        ...

    def set_reviver(self, revive: Callable[[], Awaitable[str]]) -> None:
        """How to get a fresh sandbox (its id) when this one is found gone before a command ran."""
        ...

    async def alive(self, call_id: str, *, user: str | None = None) -> list[int]:
        """Pids of processes a call started that are still alive."""
        ...

    async def end_user(self, user: str, *, remove: Sequence[str] = ()) -> bool:
        """KILL every process `user` runs in the sandbox, its resident agent included (a closed
        session's uid, with session users: what it left running must not outlive it), then
        remove what `user` owns at the top of each folder of `remove` (its records, TMPDIR and
        files on a /tmp other sessions share). True when no process is known to be left."""
        ...

    async def agent_link(self, user: str | None = None) -> AgentChannel | None:
        """The resident agent of this sandbox for `user` (started when needed); None when the
        backend has no resident agents. SandboxUnavailable when it has them but this sandbox
        cannot run one (the reason is said)."""
        ...

    async def volume_folder(self) -> Path | None:
        """The host folder of the workspace volume when the engine keeps it on this host; None
        for a remote engine, a workspace that is not a volume, or a backend without volumes."""
        ...

    def one_shot(self) -> OneShot | None:
        """One-shot sandboxes on this sandbox's engine (a skill's call runs in one)."""
        ...


@dataclass(frozen=True)
class BrowserEndpoint:
    """A running browser sandbox and where its DevTools protocol answers (host side)."""

    container_id: str
    name: str
    network: str
    cdp_url: str  # http://<the container's address on its own network>:<cdp port>
    browser_version: str
    host_firewall: bool = True  # False: the host could not drop the browser's connections to it


class Browsers(Protocol):
    """Browser sandboxes, one per scope key (a capability: `Backend.browsers`)."""

    def name_for(self, agent: EffectiveAgent, session: str) -> str:
        """The browser sandbox's name for this agent and session."""
        ...

    async def close_session(
        self, agent: EffectiveAgent, session: str, before: Callable[[str], Awaitable[object]] | None = None
    ) -> bool:
        """A session-scoped browser goes with its session; `before(name)` runs first."""
        ...

    async def ensure(self, agent: EffectiveAgent, session: str, *, browser_allowed: bool) -> BrowserEndpoint:
        """Start (or find) the browser sandbox of this scope."""
        ...


class EgressLogs(Protocol):
    """Egress proxies' request lines and leftovers (a capability: `Backend.egress`)."""

    async def collect(self, journal: Journal | None, sandbox_name: str) -> int:
        """Copy a sandbox's egress proxy lines into the journal; how many."""
        ...

    async def sweep(self, instance: str) -> list[str]:
        """Remove egress proxies and networks whose sandbox is gone; their names."""
        ...


class Freezer(Protocol):
    """Pausing idle sandboxes and thawing them (the cgroup freezer; a capability: `Backend.freezer`)."""

    async def pause(self, name_or_id: str) -> bool:
        """Freeze every process of the sandbox; False when it is not running (gone, or paused)."""
        ...

    async def thaw(self, name_or_id: str) -> bool:
        """Let it run again; False when it was not paused."""
        ...

    async def busy(self, name_or_id: str) -> bool:
        """Whether it runs anything besides its keep-alive, its init and its resident agents."""
        ...


class WarmPool(Protocol):
    """Started sandboxes kept per agent for sessions to claim (a capability: `Backend.warm_pool`)."""

    # whether `claim` itself hands nothing over to a session whose sandbox exists already (Docker:
    # the rename to its name fails); otherwise the manager asks the engine before each claim
    claim_checks_name: bool

    def pooled_agents(self) -> list[EffectiveAgent]:
        """Configured agents whose sandboxes are pooled."""
        ...

    async def member_spec(self, agent: EffectiveAgent) -> SandboxSpec | None:
        """The spec a free member of this agent's pool is made from (None: not pooled)."""
        ...

    def as_claimed(self, info: SandboxInfo) -> SandboxInfo:
        """A listed sandbox as the session that claimed it sees it (unchanged if unclaimed)."""
        ...

    def wanted(self, spec: SandboxSpec) -> bool:
        """Whether a sandbox for `spec` may come from the pool."""
        ...

    async def claim(self, spec: SandboxSpec) -> Sandbox | None:
        """A free member handed over to `spec`'s session; None when none could be."""
        ...

    async def fill_once(self) -> int:
        """Start the members missing now; how many were started."""
        ...

    async def keep_filled(self) -> None:
        """Keep every pool filled until cancelled."""
        ...

    async def stale(self) -> list[tuple[SandboxInfo, str]]:
        """Free members whose agent's pool changed or went, with why."""
        ...

    async def sweep(self) -> list[str]:
        """Remove the stale members; their names."""
        ...

    async def remove_member(self, info: SandboxInfo) -> None:
        """Remove one member and its claim."""
        ...


@dataclass(frozen=True)
class SandboxFacts:
    """What the engine says a live sandbox is (a capability: `Backend.facts`), as a person checks it."""

    name: str
    id: str
    image: str
    user: str
    network: str
    cap_drop: tuple[str, ...]
    security_opt: tuple[str, ...]  # as the engine has them (an inline seccomp profile whole)
    read_only_root: bool
    pids_limit: int | None
    memory: int  # bytes; 0: no limit
    nano_cpus: int
    init: bool | None
    mounts: tuple[Mount, ...]  # `origin` says the engine reported it; `volume` its type


class Backend(Protocol):
    """Create, find and remove sandboxes. The engine and the manager know only this.

    Implementations: `sandbox.runtime.docker.backend.DockerBackend` (`runtime.backend: docker`,
    the default), `sandbox.runtime.host.backend.HostBackend` (`host`: no isolation, for
    development), and `sandbox.testing.FakeBackend` for tests of code built on the library.
    """

    name: str

    async def image_id(self, ref: str) -> str:
        """The id of the image a spec names (part of the drift hash); SandboxUnavailable if absent."""
        ...

    async def ensure(self, spec: SandboxSpec) -> Sandbox:
        """Return the sandbox for `spec`, creating or recreating it when needed."""
        ...

    async def exists(self, name: str) -> bool:
        """Whether a sandbox of this name exists now (running or not)."""
        ...

    async def list(self, *, instance: str | None, tenant: str | None = None) -> list[SandboxInfo]:
        """Sandboxes of one instance (None: every managed sandbox on the engine); with `tenant`,
        that tenant's only (asked of the engine, so it costs what the tenant has, not what all have).
        A backend whose `list` has no `tenant` parameter (written before it) is asked for all and
        its answer filtered by the manager."""
        ...

    async def remove(self, name_or_id: str) -> None:
        """Remove a sandbox and its anonymous volumes; missing is not an error."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...

    # Optional capabilities: each returns None where this backend has none (STYLE rule 17).

    def browsers(self, instance: str) -> Browsers | None:
        """Browser sandboxes of one instance (a new manager each call: the caller keeps one)."""
        ...

    def egress(self) -> EgressLogs | None:
        """Egress proxies' logs and leftovers."""
        ...

    def warm_pool(self, manager: SandboxManager) -> WarmPool | None:
        """The warm pool of the sandboxes `manager` hands out (made once, by the manager)."""
        ...

    def freezer(self) -> Freezer | None:
        """Pausing idle sandboxes (`sandbox.idle_pause_s`)."""
        ...

    async def facts(self, name_or_id: str) -> SandboxFacts | None:
        """What the engine says a live sandbox is (user, network, limits, mounts); None where
        there is no container to describe (the host backend) or no such sandbox."""
        ...
