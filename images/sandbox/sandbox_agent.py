"""The resident agent: one long-lived process per sandbox (and user) that runs the tools' commands.

The orchestrator starts it with one `docker exec` whose stdin and stdout stay attached, then
sends it requests and reads its answers as frames on that one stream, so a command costs no
Docker API round trip. It spawns each command in its own session (its own process group, like
docker exec does), streams its output in chunks, reports its exit status and delivers signals.

It lives next to untrusted code, which runs as the same user and may kill, stop or imitate it:
the orchestrator therefore believes nothing it says beyond the one sandbox (every frame is
checked, sizes are capped, silences time out). This file is the whole agent: Python's standard
library only, no imports from the orchestrator. `--health` is the container's health check.

Frame: 4-byte big-endian header length, 4-byte big-endian payload length, a JSON header (an
object with "t", the type, and "id", the request's number), then the payload bytes.

`--link`: the frames may go over two FIFOs instead, which the orchestrator made in a folder
bind-mounted into this sandbox, so they do not pass through the engine's stream proxy. The first
line on stdin names them (a path without its `.up`/`.down`; an empty line: no FIFOs). The agent
answers one byte on stdout before any frame: `F` (the frames go over the FIFOs from now on) or
`S` (they stay on stdin and stdout). Either way stdin stays the life line: when it ends, the
agent exits.
"""

from __future__ import annotations

import _signal as signal
import errno
import os
import select
import stat
import struct
import sys
import time
from _json import encode_basestring_ascii, make_encoder, make_scanner

# Only modules written in C, and a few small ones of Python. An idle sandbox's agent is most of
# what a sandbox costs (docs/benchmarks.md, density), and Python's own modules held more of it
# than the agent itself: subprocess (with threading) and socket about 1.2 MiB; json (with re),
# selectors, contextlib (with collections and functools) and signal (with enum) 1.3 MiB more, and
# ctypes 0.6. So commands start with os.posix_spawn (Process, below); socket is imported when a
# preview first connects, ctypes at the first file request; and JSON, the selector, `suppress`
# and the signals come from the C modules those wrap (the image's python3 is CPython: its .pyc
# runs nowhere else). tests/test_resident_agent_stdlib.py checks what is imported.

PROTOCOL = 1
HEAD = struct.Struct(">II")
MAX_HEADER = 8 << 20  # a request's argv and environment (docker exec's own limit is ARG_MAX)
MAX_PAYLOAD = 8 << 20
CHUNK = 64 << 10
NO_PIDFD_POLL_S = 0.05  # without pidfd_open (old kernels), how often exits are looked for


EVENT_READ, EVENT_WRITE = 1, 2  # as the selectors module's


class Selector:
    """What the agent used of selectors.EpollSelector, on select.epoll itself: the descriptors
    (or objects with `fileno()`) it watches, each with the events wanted and a value of its own."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.data: dict[int, tuple[int, object]] = {}  # fd -> (events, data)

    def register(self, file: int | socket.socket, events: int, data: object) -> None:
        fd = descriptor(file)
        if fd in self.data:
            raise KeyError(f"descriptor {fd} is registered already")
        self.epoll.register(fd, epoll_mask(events))
        self.data[fd] = (events, data)

    def modify(self, file: int | socket.socket, events: int, data: object) -> None:
        fd = descriptor(file)
        self.epoll.modify(fd, epoll_mask(events))
        self.data[fd] = (events, data)

    def unregister(self, file: int | socket.socket) -> None:
        fd = descriptor(file)
        del self.data[fd]
        with suppress(OSError):  # closed already: the kernel dropped it then
            self.epoll.unregister(fd)

    def select(self, timeout: float | None) -> list[tuple[int, object, int]]:
        """(fd, data, events) of each descriptor ready within `timeout` seconds (None: wait)."""
        ready = []
        # epoll.poll rounds a timeout up to its milliseconds, and retries when a signal interrupts it
        for fd, mask in self.epoll.poll(-1 if timeout is None else max(timeout, 0.0), max(len(self.data), 1)):
            found = self.data.get(fd)
            if found is not None:
                # as selectors: a hang-up or an error wakes a reader and a writer alike
                events = (EVENT_WRITE if mask & ~select.EPOLLIN else 0) | (EVENT_READ if mask & ~select.EPOLLOUT else 0)
                ready.append((fd, found[1], events & found[0]))
        return ready


def descriptor(file: int | socket.socket) -> int:
    return file if isinstance(file, int) else file.fileno()


def epoll_mask(events: int) -> int:
    if not events or events & ~(EVENT_READ | EVENT_WRITE):
        raise ValueError(f"invalid events: {events!r}")
    return (select.EPOLLIN if events & EVENT_READ else 0) | (select.EPOLLOUT if events & EVENT_WRITE else 0)


class suppress:
    """suppress: the exceptions named end the block quietly."""

    def __init__(self, *errors: type[BaseException]) -> None:
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, value: object, traceback: object) -> bool:
        return kind is not None and issubclass(kind, self.errors)


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent; one too large for a float (1e999) is refused,
    not read as infinity (an id or a signal of infinity would end the agent)."""
    value = float(text)
    if value in (_INFINITY, -_INFINITY):
        raise ValueError(f"{text} is too large a number")
    return value


_INFINITY = float("inf")


def _refuse_type(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class _Parsing:
    """What _json's scanner reads its settings from (json.JSONDecoder's, with NaN and infinity
    refused)."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_int = int
    parse_float, parse_constant = staticmethod(_finite_float), staticmethod(_refuse_constant)


_scan = make_scanner(_Parsing())
# json.dumps(value, separators=(",", ":")), as json's own C encoder does it (no indent, ASCII only)
_encode = make_encoder(None, _refuse_type, encode_basestring_ascii, None, ":", ",", False, False, True)


def dumps(value: object) -> bytes:
    """`value` as compact JSON."""
    return "".join(_encode(value, 0)).encode()


def loads(raw: bytes) -> object:
    """The one JSON value in `raw` (UTF-8, whitespace around it allowed).

    Raises:
        ValueError: not UTF-8, not JSON, or more after the value. (_json builds the error of a
            malformed value from the json package, which it imports then: only a broken request
            costs that memory.)
    """
    text = raw.decode("utf-8").strip(" \t\n\r")
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        raise ValueError("expecting a JSON value") from None
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return value


class Agent:
    """The request loop: stdin frames in, stdout frames out, commands as children."""

    def __init__(self, link: bool = False) -> None:
        self.sel = Selector()
        self.inbox = bytearray()
        self.requests = 0  # where frames come from: stdin, or the link's `.down` FIFO
        self.stdout = self.out = os.fdopen(1, "wb", buffering=0)  # the life line keeps its stdout
        if link:
            self.open_link(read_line(0))
        self.children: dict[int, Child] = {}  # request id -> running command
        self.files = FileServer(self)
        self.ports = PortRelay(self)
        os.set_blocking(self.requests, False)
        self.sel.register(self.requests, EVENT_READ, ("stdin", None))
        if self.requests != 0:
            os.set_blocking(0, False)
            self.sel.register(0, EVENT_READ, ("lifeline", None))

    def open_link(self, name: str) -> None:
        """Move the frames to the FIFOs `name`.up (ours to write) and `name`.down (to read), and
        say on stdout whether that worked (`F`) or the frames stay on the stream (`S`)."""
        verdict = b"S"
        if name:
            fds: list[int] = []
            try:
                # the orchestrator holds `.up`'s read end open already: a non-blocking open for
                # writing succeeds only then (ENXIO otherwise), and never waits
                fds.append(os.open(name + ".up", os.O_WRONLY | os.O_NONBLOCK))
                fds.append(os.open(name + ".down", os.O_RDONLY | os.O_NONBLOCK))
                if not all(stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in fds):
                    raise OSError("not a FIFO")
            except OSError:
                for fd in fds:
                    os.close(fd)
            else:
                os.set_blocking(fds[0], True)  # a full FIFO waits in send, as a full stdout does
                self.out, self.requests = os.fdopen(fds[0], "wb", buffering=0), fds[1]
                verdict = b"F"
        written = 0
        while not written:
            written = self.stdout.write(verdict) or 0

    def send(self, header: dict[str, object], payload: bytes = b"") -> None:
        head = dumps(header)
        data = HEAD.pack(len(head), len(payload)) + head + payload
        view = memoryview(data)
        while view:  # the orchestrator reads as it pleases: a full pipe waits here
            written = self.out.write(view)
            view = view[written or 0 :]

    def serve(self) -> None:
        hello = {"t": "hello", "id": 0, "protocol": PROTOCOL, "pid": os.getpid(), "pidfd": hasattr(os, "pidfd_open")}
        self.send({**hello, "ports": True})
        while True:
            polled = [c for c in self.children.values() if c.pidfd is None and c.status is None]
            timeout = NO_PIDFD_POLL_S if polled else self.ports.next_deadline()
            for fd, (kind, child), events in self.sel.select(timeout):
                if kind == "stdin":
                    if not self.read_requests():
                        return  # the orchestrator went away; running commands are its to kill
                elif kind == "lifeline":  # with the link, stdin carries nothing but its end
                    with suppress(BlockingIOError):
                        if not os.read(0, CHUNK):
                            return
                elif kind == "sock":
                    if self.ports.streams.get(child.rid) is child:  # not closed earlier this round
                        self.ports.ready(child, events)
                    continue
                elif self.children.get(child.rid) is not child:
                    continue  # finished by an earlier event of this round: its fds are closed
                elif kind == "pipe":
                    if fd in child.streams:
                        child.read(fd, self)
                elif kind == "exit":
                    child.reap(self)
            for child in [c for c in self.children.values() if c.pidfd is None and c.status is None]:
                child.poll(self)
            self.ports.expire()

    def read_requests(self) -> bool:
        try:
            data = os.read(self.requests, CHUNK)
        except BlockingIOError:
            return True
        if not data:
            return False
        self.inbox += data
        while len(self.inbox) >= HEAD.size:
            head_len, payload_len = HEAD.unpack_from(self.inbox)
            if head_len > MAX_HEADER or payload_len > MAX_PAYLOAD:
                self.send({"t": "error", "id": 0, "message": "request frame too large"})
                return False
            end = HEAD.size + head_len + payload_len
            if len(self.inbox) < end:
                break
            header = bytes(self.inbox[HEAD.size : HEAD.size + head_len])
            payload = bytes(self.inbox[HEAD.size + head_len : end])
            del self.inbox[:end]
            self.handle(header, payload)
        return True

    def handle(self, raw: bytes, payload: bytes = b"") -> None:
        try:
            request = loads(raw)
            kind, rid = request["t"], int(request["id"])
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):  # nested past the stack
            self.send({"t": "error", "id": 0, "message": "unreadable request"})
            return
        try:
            if kind == "run":
                self.run(rid, request)
            elif kind == "signal":
                child = self.children.get(int(request["target"]))
                if child is not None:
                    child.signal(int(request["sig"]))
                self.send({"t": "done", "id": rid})
            elif kind == "ping":
                self.send({"t": "pong", "id": rid})
            elif kind in FILE_REQUESTS:
                self.files.handle(kind, rid, request, payload)
            elif kind in PORT_REQUESTS:
                self.ports.handle(kind, rid, request, payload)
            else:
                self.send({"t": "error", "id": rid, "message": f"unknown request {kind!r}"})
        except FileProblem as problem:
            self.send({"t": "ferror", "id": rid, **problem.fields})
        except (OSError, ValueError, KeyError, TypeError, OverflowError) as exc:  # a signal of 1e30
            self.send({"t": "error", "id": rid, "message": f"{type(exc).__name__}: {exc}"})

    def run(self, rid: int, request: dict[str, object]) -> None:
        argv = request["argv"]
        env = request.get("env") or {}
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise ValueError("argv must be a non-empty list of strings")
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise ValueError("env must map strings to strings")
        cwd = request.get("cwd")
        if any("\0" in text for text in [*argv, *env, *env.values(), cwd if isinstance(cwd, str) else ""]):
            raise ValueError("a NUL byte in the command, its environment or its folder")
        # the wrapper's pid file: removed once the command is over and its process group empty
        pid_file = request.get("pid_file")
        if pid_file is not None and not (
            isinstance(pid_file, str)
            and pid_file.startswith("/")
            and pid_file.endswith(".pid")
            and "\0" not in pid_file
        ):
            raise ValueError("pid_file must be an absolute path ending in .pid")
        # What the command's wrapper would do first (`mkdir -m MODE`, then its own checks of
        # owner and links), without a mkdir process: a sandbox's (or a session's) first command
        # is about a process faster. Its pid file's folder (1777 shared, 700 a session's own)
        # and the session's TMPDIR (700)
        pid_dir_mode = request.get("pid_dir_mode")
        if pid_file is not None and type(pid_dir_mode) is int and pid_dir_mode in (0o700, 0o1777):
            make_folder(os.path.dirname(pid_file), pid_dir_mode)
        tmpdir = env.get("SBX_TMPDIR")
        if tmpdir:
            make_folder(tmpdir, 0o700)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = Process(argv, {**os.environ, **env}, cwd if isinstance(cwd, str) and cwd else None, out_w, err_w)
        except (OSError, ValueError) as exc:  # ValueError: an empty program name or env key, a NUL
            for fd in (out_r, err_r):
                os.close(fd)
            # what a shell reports for a command that cannot start: 127 when it is missing, else
            # 126 (a working directory that is not there included)
            missing = isinstance(exc, FileNotFoundError) and exc.filename != cwd
            code = 127 if missing else 126
            reason = getattr(exc, "strerror", None) or exc
            self.send({"t": "started", "id": rid, "pid": 0})
            self.send({"t": "out", "id": rid, "stream": 2}, f"{argv[0]}: {reason}\n".encode())
            self.send({"t": "exit", "id": rid, "code": code, "signal": 0})
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        child = Child(rid, proc, out_r, err_r, pid_file)
        self.children[rid] = child
        for fd, stream in ((out_r, 1), (err_r, 2)):
            os.set_blocking(fd, False)
            self.sel.register(fd, EVENT_READ, ("pipe", child))
            child.streams[fd] = stream
        if child.pidfd is not None:
            self.sel.register(child.pidfd, EVENT_READ, ("exit", child))
        self.send({"t": "started", "id": rid, "pid": proc.pid})


# what subprocess.Popen's restore_signals puts back to default in a child (the agent ignores
# SIGPIPE). Unlike Popen, glibc's posix_spawn leaves its two internal signals (32 and 33, below
# SIGRTMIN) ignored in the command; nothing but glibc itself uses them.
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
_home: int | None = None  # the agent's own working directory (O_PATH), opened at its start


class Process:
    """A command started as subprocess.Popen(argv, env=env, cwd=cwd, stdin=DEVNULL,
    stdout=stdout, stderr=stderr, start_new_session=True) starts it (restore_signals as by
    default; what close_fds did is done once, at the agent's start: keep_descriptors_to_itself),
    with os.posix_spawn: its pid and, once reaped, its return code (negative: the signal that
    ended it).

    Raises:
        OSError: it cannot start. The working directory's error names `cwd` (a shell's 126); a
            program not found is FileNotFoundError naming the program (127).
        ValueError: an empty program name, an empty environment name, a NUL byte.
    """

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None, stdout: int, stderr: int) -> None:
        self.returncode: int | None = None
        actions: list[tuple[object, ...]] = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)]
        actions += [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in ((stdout, 1), (stderr, 2)) if fd != target]
        program = argv[0]
        # os.get_exec_path(env), which imports the warnings module on its first use
        search = env.get("PATH")
        search = os.defpath if search is None else search
        paths = [program] if "/" in program else [os.path.join(d, program) for d in search.split(os.pathsep)]
        if cwd is not None:
            os.chdir(cwd)  # the child starts in it; single-threaded, the agent comes back at once
        try:
            telling: OSError | None = None  # as Popen: the first that starts, else the first
            missing: OSError | None = None  # error other than "not there", else "not there"
            for path in paths:
                try:
                    self.pid = os.posix_spawn(
                        path, argv, env, file_actions=actions, setsid=True, setsigdef=DEFAULT_SIGNALS
                    )
                    return
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                        missing = missing or exc
                    elif telling is None:
                        telling = exc
            raise telling or missing or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        finally:
            if cwd is not None:
                go_home()  # never raises: a command that started is never reported as not started

    def poll(self) -> int | None:
        if self.returncode is None:
            self._wait(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._wait(0)
        return self.returncode

    def _wait(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere: Popen reports 0 then too
            self.returncode = 0
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def go_home() -> None:
    """Back to the agent's own working directory; to / when it cannot be entered any more (the
    sandbox's user, the agent's own, may take its search permission away)."""
    if _home is not None:
        with suppress(OSError):
            os.fchdir(_home)
            return
    with suppress(OSError):
        os.chdir("/")


def keep_descriptors_to_itself() -> None:
    """At start: no descriptor the agent was handed (beyond 0, 1, 2) may pass to a command, as
    Popen's close_fds made sure; its own are opened close-on-exec. Also opens `_home`."""
    global _home
    with suppress(OSError):
        _home = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every number a descriptor can have here
        fds = list(range(3, min(os.sysconf("SC_OPEN_MAX"), 1 << 16)))
    for fd in fds:
        if fd > 2:
            with suppress(OSError):  # not open (or the listing's own, closed by now)
                os.set_inheritable(fd, False)


class Child:
    """One running command: its pipes, its exit watch."""

    def __init__(
        self, rid: int, proc: Process, out_r: int, err_r: int, pid_file: str | None = None
    ) -> None:
        self.rid = rid
        self.proc = proc
        self.pid_file = pid_file
        self.streams: dict[int, int] = {}
        self.status: int | None = None  # the return code, once it has exited
        try:
            self.pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def read(self, fd: int, agent: Agent) -> None:
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if data:
            agent.send({"t": "out", "id": self.rid, "stream": self.streams[fd]}, data)
        else:
            self.close_pipe(fd, agent)

    def close_pipe(self, fd: int, agent: Agent) -> None:
        agent.sel.unregister(fd)
        os.close(fd)
        del self.streams[fd]
        self.finish_if_done(agent)

    def poll(self, agent: Agent) -> None:
        if self.status is None and self.proc.poll() is not None:
            self.exited(agent)

    def reap(self, agent: Agent) -> None:
        self.proc.wait()
        self.exited(agent)

    def exited(self, agent: Agent) -> None:
        self.status = self.proc.returncode
        if self.pidfd is not None:
            agent.sel.unregister(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None
        self.finish_if_done(agent)

    def finish_if_done(self, agent: Agent) -> None:
        # as docker exec: the command is over when it has exited and its output has ended (a
        # background child that keeps the pipes open keeps it going, until the caller kills it)
        if self.status is None or self.streams:
            return
        del agent.children[self.rid]
        sig = -self.status if self.status < 0 else 0
        agent.send({"t": "exit", "id": self.rid, "code": 128 + sig if sig else self.status, "signal": sig})
        self.forget_pid_file()  # after the answer: off the call's path

    def signal(self, sig: int) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def forget_pid_file(self) -> None:
        """One pid file per call stayed on the sandbox's /tmp (a tmpfs other sessions share) and
        filled it after some 65,000 calls. It is kept while its process group has a member left
        (a background child outliving the shell: a kill of the call still needs the group)."""
        if self.pid_file is None:
            return
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            with suppress(OSError):
                os.unlink(self.pid_file)
        except OSError:
            pass  # a member we may not signal: kept


# -- file operations beneath a root (a workspace on a volume, which the host cannot see) -----

FILE_REQUESTS = frozenset({"fstat", "fread", "fwrite", "funlink"})
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x04, 0x08
SYS_OPENAT2 = 437  # the same number on every architecture that has it
READ_CHUNK = 512 << 10


class FileProblem(Exception):
    """A refusal the orchestrator turns into the same error a host-side workspace gives."""

    def __init__(self, errno_: int, why: str = "", **extra: object) -> None:
        super().__init__(why or os.strerror(errno_))
        self.fields = {"errno": errno_, "why": why, **extra}


def _parts(request: dict[str, object]) -> tuple[str, list[str]]:
    root, parts = request["root"], request["parts"]
    if not (isinstance(root, str) and root.startswith("/") and isinstance(parts, list)):
        raise ValueError("root must be absolute and parts a list")
    for part in parts:
        # the orchestrator checked them already; a component is never a path of its own here
        if not isinstance(part, str) or part in ("", ".", "..") or "/" in part or "\0" in part:
            raise ValueError(f"bad path component {part!r}")
    return root, parts


class FileServer:
    """Files beneath a root, never through a symbolic link: openat2(RESOLVE_BENEATH |
    RESOLVE_NO_SYMLINKS) where the kernel has it, else a walk that opens each folder with
    O_NOFOLLOW from the one before. Runs as the sandbox user: it can reach nothing the
    sandbox's own commands cannot; the rules are the file tools' (links are never followed)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.writes: dict[int, tuple[int, int, str, str, int]] = {}  # id -> (dir fd, fd, tmp, name, mode)
        # found on the first file request: ctypes held 0.6 MiB of every agent, and most agents
        # serve no file (a workspace the host can see is read there)
        self.openat2: object = None
        self.probed = False
        self.dir_mode = 0o755

    @staticmethod
    def _probe_openat2() -> object:
        if os.environ.get("SBX_AGENT_NO_OPENAT2"):  # the walk alone (old kernels; tests)
            return None
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            return libc.syscall
        except (ImportError, OSError, AttributeError):
            return None

    def _open_beneath(self, dirfd: int, rel: str) -> int | None:
        """A folder beneath `dirfd` by openat2, or None where the kernel lacks it."""
        if not self.probed:
            self.openat2, self.probed = self._probe_openat2(), True
        if self.openat2 is None:
            return None
        import ctypes

        how = struct.pack("QQQ", DIR_FLAGS, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
        buf = ctypes.create_string_buffer(how)
        fd = self.openat2(SYS_OPENAT2, dirfd, rel.encode(), buf, len(how))  # type: ignore[operator]
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err in (38, 1):  # ENOSYS, EPERM (a seccomp filter that does not know it): walk instead
            self.openat2 = None
            return None
        raise OSError(err, os.strerror(err))

    def _dir(self, root: str, parts: list[str], create: bool = False) -> int:
        fd = os.open(root, DIR_FLAGS)
        if not parts:
            return fd
        try:
            found = self._open_beneath(fd, "/".join(parts))
            if found is not None:
                os.close(fd)
                return found
        except OSError:
            pass  # the walk below says precisely what is wrong (a link, a missing folder), or makes it
        try:
            for part in parts:
                try:
                    nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
                except NotADirectoryError:
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise FileProblem(40, "symlink") from None
                    raise
                except FileNotFoundError:
                    if not create:
                        raise
                    made = False
                    with suppress(FileExistsError):
                        os.mkdir(part, self._dir_mode(), dir_fd=fd)
                        made = True
                    nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
                    if made:
                        os.fchmod(nxt, self._dir_mode())  # past the umask (a group-shared 2775)
                os.close(fd)
                fd = nxt
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _dir_mode(self) -> int:
        return self.dir_mode

    @staticmethod
    def _stat(st: os.stat_result) -> dict[str, int]:
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "mode": st.st_mode}

    def handle(self, kind: str, rid: int, request: dict[str, object], payload: bytes) -> None:
        try:
            self._handle(kind, rid, request, payload)
        except OSError as exc:
            raise FileProblem(exc.errno or 5, "symlink" if exc.errno in (40, 18) else "") from None

    def _handle(self, kind: str, rid: int, request: dict[str, object], payload: bytes) -> None:
        root, parts = _parts(request)
        dir_mode = request.get("dir_mode")
        self.dir_mode = int(dir_mode) if isinstance(dir_mode, int) else 0o755
        if kind == "fwrite":
            self.write(rid, root, parts, request, payload)
            return
        if not parts and kind != "fstat":
            raise FileProblem(21, "the root itself")
        dfd = self._dir(root, parts[:-1])
        try:
            if kind == "fstat":
                try:
                    st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False) if parts else os.fstat(dfd)
                except FileNotFoundError:
                    self.agent.send({"t": "file", "id": rid, "exists": False, "size": 0, "mtime_ns": 0, "mode": 0})
                    return
                self.agent.send({"t": "file", "id": rid, "exists": True, **self._stat(st)})
            elif kind == "fread":
                self.read(rid, dfd, parts[-1], int(request["max"]))  # type: ignore[arg-type]
            elif kind == "funlink":
                os.unlink(parts[-1], dir_fd=dfd)
                self.agent.send({"t": "done", "id": rid})
        finally:
            os.close(dfd)

    def read(self, rid: int, dfd: int, name: str, max_bytes: int) -> None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (6, 95):  # ENXIO, EOPNOTSUPP: a socket
                raise FileProblem(exc.errno, "not_regular") from None
            raise FileProblem(exc.errno or 5, "symlink" if exc.errno == 40 else "") from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise FileProblem(21, "is_dir")
            if not stat.S_ISREG(st.st_mode):
                raise FileProblem(22, "not_regular")
            if st.st_size > max_bytes:
                raise FileProblem(27, "too_big", size=st.st_size)
            left = st.st_size + 1
            while left > 0:
                chunk = os.read(fd, min(left, READ_CHUNK))
                if not chunk:
                    break
                self.agent.send({"t": "data", "id": rid}, chunk)
                left -= len(chunk)
            self.agent.send({"t": "file", "id": rid, "exists": True, **self._stat(st)})
        finally:
            os.close(fd)

    def _abandon(self, rid: int) -> None:
        """Forget an unfinished write of this id (its temp file goes)."""
        found = self.writes.pop(rid, None)
        if found is None:
            return
        dfd, fd, tmp, _, _ = found
        with suppress(OSError):
            os.close(fd)
        with suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        with suppress(OSError):
            os.close(dfd)

    def write(self, rid: int, root: str, parts: list[str], request: dict[str, object], payload: bytes) -> None:
        """Chunks of one write arrive as fwrite frames of one id, the first marked `first`; the last
        renames the temp file over the name (readers see the old file or the new one, never a
        mix). Once a chunk failed (answered `ferror`), the rest of that write is dropped."""
        if not request.get("first") and rid not in self.writes:
            return  # the rest of a write that failed (or was never begun): answered already
        if request.get("first"):
            self._abandon(rid)
            if not parts:
                raise FileProblem(21, "the root itself")
            dfd = self._dir(root, parts[:-1], create=True)
            name = parts[-1]
            mode = request.get("mode")
            mode = int(mode) if isinstance(mode, int) else 0o644
            try:
                old = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            except BaseException:
                os.close(dfd)
                raise
            if old is not None and stat.S_ISDIR(old.st_mode):
                os.close(dfd)
                raise FileProblem(21, "is_dir")
            if old is not None and stat.S_ISREG(old.st_mode):
                mode = stat.S_IMODE(old.st_mode)
            tmp = f".{name[:200]}.{os.urandom(4).hex()}.sbx-tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
            except OSError:
                os.close(dfd)
                raise
            self.writes[rid] = (dfd, fd, tmp, name, mode)
        dfd, fd, tmp, name, mode = self.writes[rid]
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            if not request.get("last"):
                return
            os.fchmod(fd, mode)
            os.fsync(fd)
            st = os.fstat(fd)
            os.close(fd)
            fd = -1
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            del self.writes[rid]
            os.close(dfd)
            self.agent.send({"t": "file", "id": rid, "exists": True, **self._stat(st)})
        except BaseException:
            self.writes.pop(rid, None)
            if fd >= 0:
                os.close(fd)
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            os.close(dfd)
            raise


# -- a port on the sandbox's own loopback, for previews -------------------------------------

PORT_REQUESTS = frozenset({"popen", "pdata", "pack", "pclose"})
PORT_WINDOW = 256 << 10  # bytes sent and not yet acknowledged, per stream and direction
MAX_PORT_STREAMS = 64
CONNECT_S = 5.0  # a server that has not accepted by then (its backlog full) is refused, not waited for
TCP_ESTABLISHED = "01"
LOOPBACKS = ((2, "127.0.0.1"), (10, "::1"))  # AF_INET, AF_INET6 (Linux)


class PortStream:
    """One connection to a loopback port: what waits to be written to it, what was sent on."""

    def __init__(self, rid: int, sock: socket.socket, port: int, index: int) -> None:
        self.rid = rid
        self.sock = sock
        self.port = port
        self.index = index  # which of LOOPBACKS
        self.outbox = bytearray()
        self.unacked = 0  # sent to the orchestrator, not yet acknowledged
        self.events = 0  # what the selector watches for it
        self.deadline: float | None = None  # while it connects (never blocking the agent's loop)


class PortRelay:
    """Connections to ports on this sandbox's loopback, carried over this stream (the sandbox
    needs no network for a preview). A connection is kept only when the server that accepted it
    runs as this agent's own user: where sessions share a sandbox with their own uids, a session
    reaches its own servers, never another session's."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.streams: dict[int, PortStream] = {}

    def handle(self, kind: str, rid: int, request: dict[str, object], payload: bytes) -> None:
        if kind == "popen":
            self.open(rid, request)
            return
        stream = self.streams.get(rid)
        if stream is None:
            return  # closed already (by either side): late data and acknowledgements are dropped
        if kind == "pdata":
            stream.outbox += payload
            self.flush(stream)
        elif kind == "pack":
            stream.unacked = max(0, stream.unacked - int(request["n"]))  # type: ignore[call-overload]
            self.watch(stream)
        elif kind == "pclose":
            self.close(stream, tell=False)

    def open(self, rid: int, request: dict[str, object]) -> None:
        port = request["port"]
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError("port must be a number from 1 to 65535")
        if len(self.streams) >= MAX_PORT_STREAMS:
            self.refuse(rid, "busy", f"{MAX_PORT_STREAMS} connections are open already")
            return
        self.connect(rid, port, 0)

    def connect(self, rid: int, port: int, index: int) -> None:
        """Start connecting to the loopback address `index` (IPv4, then IPv6), without waiting:
        the answer goes once the selector says the socket is writable (see `ready`)."""
        if index >= len(LOOPBACKS):
            self.refuse(rid, "not_listening", f"nothing listens on port {port} of the sandbox's loopback")
            return
        import socket  # here, not at the top: an agent that relays no port never holds it

        family, host = LOOPBACKS[index]
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 in this sandbox
            self.connect(rid, port, index + 1)
            return
        sock.setblocking(False)
        code = sock.connect_ex((host, port))
        stream = PortStream(rid, sock, port, index)
        self.streams[rid] = stream
        if code in (0, 115):  # connected, or EINPROGRESS: the selector says when
            stream.deadline = time.monotonic() + CONNECT_S
            stream.events = EVENT_WRITE
            self.agent.sel.register(sock, EVENT_WRITE, ("sock", stream))
            return
        del self.streams[rid]
        sock.close()
        self.connect(rid, port, index + 1)

    def connected(self, stream: PortStream) -> None:
        """The connect of `stream` finished: keep it if our own user's server accepted it."""
        import socket  # imported by connect already: a lookup

        error = stream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self.agent.sel.unregister(stream.sock)
        stream.events = 0
        stream.deadline = None
        if error:
            del self.streams[stream.rid]
            stream.sock.close()
            self.connect(stream.rid, stream.port, stream.index + 1)
            return
        if accepted_by(stream.sock, stream.port) != os.getuid():
            del self.streams[stream.rid]
            stream.sock.close()
            self.refuse(
                stream.rid, "not_owner", f"the server on port {stream.port} does not run as this session's user"
            )
            return
        self.watch(stream)
        self.agent.send({"t": "popened", "id": stream.rid})

    def next_deadline(self) -> float | None:
        """Seconds until the first connect in progress gives up (None: none is)."""
        pending = [s.deadline for s in self.streams.values() if s.deadline is not None]
        return max(0.0, min(pending) - time.monotonic()) if pending else None

    def expire(self) -> None:
        """Refuse the connects whose server did not accept in time (a full backlog)."""
        now = time.monotonic()
        for stream in [s for s in self.streams.values() if s.deadline is not None and s.deadline <= now]:
            self.close(stream, tell=False)
            self.refuse(
                stream.rid, "not_accepting", f"the server on port {stream.port} did not accept in {CONNECT_S:.0f} s"
            )

    def refuse(self, rid: int, why: str, message: str) -> None:
        self.agent.send({"t": "prefused", "id": rid, "why": why, "message": message})

    def watch(self, stream: PortStream) -> None:
        """Read while the window has room; write while something waits."""
        events = (EVENT_READ if stream.unacked < PORT_WINDOW else 0) | (
            EVENT_WRITE if stream.outbox else 0
        )
        if events == stream.events:
            return
        if not stream.events:
            self.agent.sel.register(stream.sock, events, ("sock", stream))
        elif not events:
            self.agent.sel.unregister(stream.sock)
        else:
            self.agent.sel.modify(stream.sock, events, ("sock", stream))
        stream.events = events

    def ready(self, stream: PortStream, events: int) -> None:
        if stream.deadline is not None:
            self.connected(stream)
            return
        if events & EVENT_WRITE:
            self.flush(stream)
        if events & EVENT_READ and self.streams.get(stream.rid) is stream:
            try:
                data = stream.sock.recv(min(CHUNK, PORT_WINDOW - stream.unacked))
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close(stream, tell=True)
                return
            stream.unacked += len(data)
            self.agent.send({"t": "pdata", "id": stream.rid}, data)
            self.watch(stream)

    def flush(self, stream: PortStream) -> None:
        sent = 0
        try:
            while stream.outbox:
                written = stream.sock.send(stream.outbox)
                del stream.outbox[:written]
                sent += written
        except BlockingIOError:
            pass
        except OSError:
            self.close(stream, tell=True)
            return
        if sent:
            self.agent.send({"t": "pack", "id": stream.rid, "n": sent})
        self.watch(stream)

    def close(self, stream: PortStream, *, tell: bool) -> None:
        if self.streams.pop(stream.rid, None) is None:
            return
        if stream.events:
            self.agent.sel.unregister(stream.sock)
        stream.sock.close()
        if tell:
            self.agent.send({"t": "pclosed", "id": stream.rid})


def accepted_by(sock: socket.socket, port: int) -> int | None:
    """The uid that owns the server side of this fresh loopback connection (the kernel's own
    socket table: an accepted socket carries its listener's owner), None when it is not found."""
    mine = sock.getsockname()[1]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as rows:
                next(rows, None)
                for row in rows:
                    fields = row.split()
                    if len(fields) < 8 or fields[3] != TCP_ESTABLISHED:
                        continue
                    local, remote = fields[1].rpartition(":")[2], fields[2].rpartition(":")[2]
                    if int(local, 16) == port and int(remote, 16) == mine:
                        return int(fields[7])
        except (OSError, ValueError):
            continue
    return None


def make_folder(path: str, mode: int) -> None:
    """Make the last folder of `path` with `mode` (the umask aside, as `mkdir -m` does), when it
    is missing. Only the last one: a missing parent (a session's private record folder) is the
    wrapper's to make, with its own mode and checks. The mode is set on the folder this call made,
    never through a link (one planted in its place makes the mkdir fail: nothing changes); only a
    process of the agent's own user could swap another folder in between, and that user may chmod
    its folders anyway."""
    try:
        os.mkdir(path, 0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        os.fchmod(fd, mode)
    except OSError:
        pass
    finally:
        os.close(fd)


def health() -> int:
    """The container's health check: this agent can start a command here (exec works, the pids
    limit is not used up, the filesystem answers)."""
    try:
        proc = Process(["true"], dict(os.environ), None, 1, 2)
    except OSError:
        return 1
    deadline = time.monotonic() + 5
    while proc.poll() is None:
        if time.monotonic() > deadline:  # a command that cannot finish starting: unhealthy
            with suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return 1
        time.sleep(0.01)
    return proc.returncode


def read_line(fd: int, limit: int = 4096) -> str:
    """One line from `fd` (blocking), a byte at a time: nothing after it is consumed."""
    line = bytearray()
    while len(line) < limit:
        byte = os.read(fd, 1)
        if not byte or byte == b"\n":
            break
        line += byte
    return line.decode("utf-8", "replace")


def main() -> int:
    keep_descriptors_to_itself()
    if sys.argv[1:] == ["--health"]:
        return health()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    with suppress(BrokenPipeError, ConnectionResetError):  # the orchestrator closed the stream
        Agent(link=sys.argv[1:] == ["--link"]).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
