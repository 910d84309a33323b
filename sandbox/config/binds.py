"""Bind-mount validation: what a sandbox may see of the host, decided before any container exists.

Sources are resolved through symlinks (deepest existing ancestor) and then refused when the real
path equals, lies under, or is an ancestor of a blocked path. The container gets the *resolved*
path, so what Docker mounts is what was checked. The same checks run when a config is loaded
(with key paths) and when a sandbox is made, so they sit here, below the runtime.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Literal

from sandbox.config.merge import effective_agent
from sandbox.errors import BindRefused

if TYPE_CHECKING:
    from sandbox.config.locate import Loc
    from sandbox.config.models import Config, DockerConfig

CONTAINER_WORKDIR = "/workspace"
PARENT_MOUNT = "/parent"  # where a spawned session sees its parent's workspace

SYSTEM_PATHS: tuple[str, ...] = (
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/root",
    "/run",
    "/var/run",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/run/containerd",
    "/var/lib/kubelet",
    "/usr",
    "/lib",
)
CREDENTIAL_DIRS: tuple[str, ...] = (
    ".ssh",
    ".aws",
    ".kube",
    ".docker",
    ".gnupg",
    ".config",
    ".netrc",
    ".npm",
    ".cargo",
)
SHADOW_TARGETS: tuple[str, ...] = (
    CONTAINER_WORKDIR,
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/usr",
    "/bin",
    "/lib",
)

# where servers put their Unix sockets: never a bind source (a socket in a sandbox is a door
# to its server, `network: none` notwithstanding); /run, /dev/shm and /run/user are system paths
SOCKET_HOMES: tuple[str, ...] = ("/tmp", "/var/tmp")
SOCKET_DIR_PREFIXES: tuple[str, ...] = (
    ".X11-unix",
    ".ICE-unix",
    ".XIM-unix",
    ".font-unix",
    ".Test-unix",
    ".s.PGSQL.",
    "tmux-",
    "ssh-",
    "systemd-private-",
    "mysql.sock",
)
SCAN_MAX_ENTRIES = 20_000
SCAN_MAX_SECONDS = 1.0

Mode = Literal["ro", "rw"]


@dataclass(frozen=True)
class BindSpec:
    """One parsed bind: `source` is the resolved host path given to Docker."""

    source: str
    target: str
    mode: Mode
    declared: str  # the text as written, for messages and audit

    @property
    def read_only(self) -> bool:
        """Whether the container sees it read-only."""
        return self.mode == "ro"


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _relation(path: str, blocked: str) -> str | None:
    if path == blocked:
        return "is"
    if _is_within(path, blocked):
        return "lies under"
    if _is_within(blocked, path):
        return "is an ancestor of"
    return None


def home_dirs() -> list[str]:
    """Homes whose credential folders are protected: $HOME, the passwd home, every /home/*."""
    homes = {os.path.expanduser("~")}
    with contextlib.suppress(KeyError):
        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    try:
        with os.scandir("/home") as entries:
            homes.update(e.path for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        pass
    return sorted(os.path.realpath(h) for h in homes if h and h != "/")


def credential_paths() -> list[str]:
    """Every protected credential directory (existing or not)."""
    return [os.path.join(home, name) for home in home_dirs() for name in CREDENTIAL_DIRS]


def parse_bind(text: str) -> tuple[str, str, Mode]:
    """Split `host:container[:ro|rw]` (default ro).

    Raises:
        BindRefused: the text is not of that form.
    """
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise BindRefused(
            f"bind {text!r} is not `host:container[:ro|rw]`",
            rule="bind-format",
            path=text,
            fix="write it as /host/path:/container/path:ro",
        )
    mode = parts[2] if len(parts) == 3 else "ro"
    if mode not in ("ro", "rw"):
        raise BindRefused(
            f"bind {text!r} has mode {mode!r}; expected ro or rw",
            rule="bind-format",
            path=text,
            fix="end the bind with :ro or :rw",
        )
    return parts[0], parts[1], "rw" if mode == "rw" else "ro"


def check_source(source: str, docker: DockerConfig, *, what: str = "bind source") -> str:
    """Resolve a host path and apply every source rule; return the resolved path.

    Raises:
        BindRefused: naming the rule, the path and how to fix it.
    """
    expanded = os.path.expanduser(source)
    if not os.path.isabs(expanded):
        raise BindRefused(
            f"{what} {source!r} is not an absolute path",
            rule="relative-source",
            path=source,
            fix="use an absolute host path",
        )
    real = os.path.realpath(expanded)
    via = f" (resolved from {source!r})" if real != os.path.normpath(expanded) else ""
    if not docker.dangerously_allow_system_paths:
        if real == "/":
            raise BindRefused(
                f"{what} {real!r}{via} is the host root",
                rule="system-path",
                path=real,
                fix="bind the one project directory the agent needs",
            )
        for blocked in SYSTEM_PATHS:
            relation = _relation(real, blocked)
            if relation:
                raise BindRefused(
                    f"{what} {real!r}{via} {relation} the system path {blocked}",
                    rule="system-path",
                    path=real,
                    fix="bind a directory outside system paths, or set docker.dangerously_allow_system_paths (audited)",
                )
    if not docker.dangerously_allow_credential_paths:
        if real == "/home":  # holds every user's credentials, today's users and tomorrow's
            raise BindRefused(
                f"{what} {real!r}{via} is an ancestor of the credentials paths /home/*/.ssh (and .aws, .kube, ...)",
                rule="credential-path",
                path=real,
                fix="bind one project directory inside a home, not the homes themselves",
            )
        for blocked in credential_paths():
            relation = _relation(real, blocked)
            if relation:
                raise BindRefused(
                    f"{what} {real!r}{via} {relation} the credentials path {blocked}",
                    rule="credential-path",
                    path=real,
                    fix="bind a subdirectory that holds no credentials, or set "
                    "docker.dangerously_allow_credential_paths (audited)",
                )
    if not docker.dangerously_allow_sockets and (home := _socket_home(real)):
        raise BindRefused(
            f"{what} {real!r}{via} {home}, where servers keep their Unix sockets (X11, tmux, ssh-agent, "
            "databases); a sandbox with it mounted can connect to them, network none notwithstanding",
            rule="socket-home",
            path=real,
            fix="bind a project directory of its own, not a shared temp or runtime dir",
        )
    if not docker.dangerously_allow_sockets and _is_socket(real):
        raise BindRefused(
            f"{what} {real!r}{via} is a socket; a socket in a sandbox is a door to its server",
            rule="socket",
            path=real,
            fix="do not bind sockets, or set docker.dangerously_allow_sockets (audited)",
        )
    roots = docker.allowed_bind_roots
    if roots is not None and not any(_is_within(real, os.path.realpath(r)) for r in roots):
        raise BindRefused(
            f"{what} {real!r}{via} is outside docker.allowed_bind_roots",
            rule="outside-allowed-roots",
            path=real,
            fix=f"move it under one of {', '.join(str(r) for r in roots)} or extend the list",
        )
    return real


def _socket_home(real: str) -> str | None:
    """How `real` is a socket home (`is /tmp`, `lies in /tmp/.X11-unix`), or None."""
    for home in SOCKET_HOMES:
        if real == home:
            return f"is {home}"
        if _is_within(real, home):
            first = real[len(home) + 1 :].split("/", 1)[0]
            if first.startswith(SOCKET_DIR_PREFIXES):
                return f"lies in {home}/{first}"
    return None


@dataclass(frozen=True)
class SocketScan:
    """Unix sockets found below some roots, and whether the bounded walk saw everything."""

    sockets: tuple[str, ...]
    complete: bool


def find_sockets(
    roots: Iterable[str], *, max_entries: int = SCAN_MAX_ENTRIES, max_seconds: float = SCAN_MAX_SECONDS
) -> SocketScan:
    """Walk `roots` (never through a link) for Unix sockets, within an entry and a time budget."""
    found: list[str] = []
    seen = 0
    deadline = time.monotonic() + max_seconds
    unique = sorted({os.path.realpath(r) for r in roots})
    # a root inside another is walked with it
    stack = [r for r in unique if not any(o != r and _is_within(r, o) for o in unique)]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    seen += 1
                    if seen > max_entries or time.monotonic() > deadline:
                        return SocketScan(tuple(found), False)
                    try:
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except OSError:
                        continue
                    if stat.S_ISSOCK(mode):
                        found.append(entry.path)
                    elif stat.S_ISDIR(mode):
                        stack.append(entry.path)
        except OSError:
            continue  # a file root, or a folder we may not read: the engine mounts it as it is
    for root in unique:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(root).st_mode):
                found.append(root)
    return SocketScan(tuple(sorted(set(found))), True)


def refuse_sockets(sources: Iterable[str], docker: DockerConfig) -> SocketScan:
    """At create time: refuse mounts with a Unix socket below them (bounded; see :func:`find_sockets`).

    Raises:
        BindRefused: rule `contains-socket`, naming the first socket.
    """
    if docker.dangerously_allow_sockets:
        return SocketScan((), True)
    scan = find_sockets(sources)
    if scan.sockets:
        first = scan.sockets[0]
        more = f" (and {len(scan.sockets) - 1} more)" if len(scan.sockets) > 1 else ""
        raise BindRefused(
            f"a mount of this sandbox holds the Unix socket {first!r}{more}; a sandbox reaches every socket "
            "below its mounts, read-only or not, network none notwithstanding",
            rule="contains-socket",
            path=first,
            fix="remove the socket, move the server's socket dir out of the workspace and binds "
            "(e.g. postgres unix_socket_directories), or set docker.dangerously_allow_sockets (audited)",
        )
    return scan


def _is_socket(path: str) -> bool:
    if path.endswith(".sock"):
        return True
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def check_target(target: str, declared: str) -> str:
    """Apply the container-side rules; return the normalised target.

    Raises:
        BindRefused: the target is relative or would shadow a path the sandbox relies on.
    """
    if not target.startswith("/"):
        raise BindRefused(
            f"bind {declared!r}: container path {target!r} is not absolute",
            rule="target-relative",
            path=target,
            fix="use an absolute container path such as /mnt/data",
        )
    normal = str(PurePosixPath(os.path.normpath(target)))
    if normal == "/" or any(_relation(normal, shadowed) for shadowed in SHADOW_TARGETS):
        raise BindRefused(
            f"bind {declared!r}: container path {normal!r} would shadow a path the sandbox "
            f"relies on ({', '.join(('/', *SHADOW_TARGETS))})",
            rule="target-shadows",
            path=normal,
            fix="mount it elsewhere, e.g. /mnt/<name> or /data/<name>",
        )
    return normal


def validate_binds(binds: Iterable[str], docker: DockerConfig) -> list[BindSpec]:
    """Parse and check every bind of a sandbox; targets must be unique.

    Raises:
        BindRefused: for the first bind that breaks a rule.
    """
    specs: list[BindSpec] = []
    targets: set[str] = set()
    for text in binds:
        source, target, mode = parse_bind(text)
        real = check_source(source, docker)
        normal = check_target(target, text)
        if normal in targets:
            raise BindRefused(
                f"bind {text!r}: container path {normal!r} is already mounted",
                rule="target-duplicate",
                path=normal,
                fix="give each bind its own container path",
            )
        targets.add(normal)
        specs.append(BindSpec(source=real, target=normal, mode=mode, declared=text))
    return specs


def bind_problems(config: Config) -> list[tuple[Loc, str]]:
    """Check every configured bind and bound workspace at load time, with key paths."""
    problems: list[tuple[Loc, str]] = []
    defaults = config.agents.defaults.sandbox
    for index, text in enumerate(defaults.docker.binds):
        loc: Loc = ("agents", "defaults", "sandbox", "docker", "binds", index)
        problems.extend(_problem(loc, partial(validate_binds, [text], defaults.docker)))
    for a_index, agent in enumerate(config.agents.list or []):
        merged = effective_agent(config, agent.id)
        for index, text in enumerate(agent.sandbox.docker.binds):
            loc = ("agents", "list", a_index, "sandbox", "docker", "binds", index)
            problems.extend(_problem(loc, partial(validate_binds, [text], merged.sandbox.docker)))
        if merged.sandbox.mode != "off" and merged.sandbox.workspace_access != "none":
            loc = ("agents", "list", a_index, "workspace")
            ws = str(merged.workspace)
            problems.extend(_problem(loc, partial(check_source, ws, merged.sandbox.docker, what="workspace")))
    return problems


def _problem(loc: Loc, check: Callable[[], object]) -> list[tuple[Loc, str]]:
    try:
        check()
    except BindRefused as exc:
        return [(loc, f"{exc.message} [rule {exc.rule}]; fix: {exc.fix}")]
    return []
