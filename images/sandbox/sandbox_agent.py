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
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import struct
import subprocess
import sys

PROTOCOL = 1
HEAD = struct.Struct(">II")
MAX_HEADER = 8 << 20  # a request's argv and environment (docker exec's own limit is ARG_MAX)
MAX_PAYLOAD = 8 << 20
CHUNK = 64 << 10
NO_PIDFD_POLL_S = 0.05  # without pidfd_open (old kernels), how often exits are looked for


class Agent:
    """The request loop: stdin frames in, stdout frames out, commands as children."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.inbox = bytearray()
        self.out = os.fdopen(1, "wb", buffering=0)
        self.children: dict[int, Child] = {}  # request id -> running command
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, ("stdin", None))

    def send(self, header: dict[str, object], payload: bytes = b"") -> None:
        head = json.dumps(header, separators=(",", ":")).encode()
        data = HEAD.pack(len(head), len(payload)) + head + payload
        view = memoryview(data)
        while view:  # the orchestrator reads as it pleases: a full pipe waits here
            written = self.out.write(view)
            view = view[written or 0 :]

    def serve(self) -> None:
        self.send({"t": "hello", "id": 0, "protocol": PROTOCOL, "pid": os.getpid(), "pidfd": hasattr(os, "pidfd_open")})
        while True:
            polled = [c for c in self.children.values() if c.pidfd is None and c.status is None]
            timeout = NO_PIDFD_POLL_S if polled else None
            for key, _ in self.sel.select(timeout):
                kind, child = key.data
                if kind == "stdin":
                    if not self.read_requests():
                        return  # the orchestrator went away; running commands are its to kill
                elif self.children.get(child.rid) is not child:
                    continue  # finished by an earlier event of this round: its fds are closed
                elif kind == "pipe":
                    if key.fd in child.streams:
                        child.read(key.fd, self)
                elif kind == "exit":
                    child.reap(self)
            for child in [c for c in self.children.values() if c.pidfd is None and c.status is None]:
                child.poll(self)

    def read_requests(self) -> bool:
        try:
            data = os.read(0, CHUNK)
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
            del self.inbox[:end]
            self.handle(header)
        return True

    def handle(self, raw: bytes) -> None:
        try:
            request = json.loads(raw)
            kind, rid = request["t"], int(request["id"])
        except (ValueError, KeyError, TypeError):
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
            else:
                self.send({"t": "error", "id": rid, "message": f"unknown request {kind!r}"})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.send({"t": "error", "id": rid, "message": f"{type(exc).__name__}: {exc}"})

    def run(self, rid: int, request: dict[str, object]) -> None:
        argv = request["argv"]
        env = request.get("env") or {}
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise ValueError("argv must be a non-empty list of strings")
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise ValueError("env must map strings to strings")
        cwd = request.get("cwd")
        tmpdir = env.get("SBX_TMPDIR")
        if tmpdir and not os.path.isdir(tmpdir):
            # what the command's wrapper would do first (mkdir -m 700, then its own checks of
            # owner and links), without a mkdir process: a session's first command is faster.
            # Only the last folder: a missing parent (a session's private record folder) is the
            # wrapper's to make, with its own mode and checks
            with contextlib.suppress(OSError):
                os.mkdir(tmpdir, 0o700)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env={**os.environ, **env},
                cwd=cwd if isinstance(cwd, str) and cwd else None,
                start_new_session=True,  # its own session and process group, as docker exec does
            )
        except OSError as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            # what a shell reports for a command that cannot start: 127 when it is missing, else
            # 126 (a working directory that is not there included)
            missing = isinstance(exc, FileNotFoundError) and exc.filename != cwd
            code = 127 if missing else 126
            self.send({"t": "started", "id": rid, "pid": 0})
            self.send({"t": "out", "id": rid, "stream": 2}, f"{argv[0]}: {exc.strerror or exc}\n".encode())
            self.send({"t": "exit", "id": rid, "code": code, "signal": 0})
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        child = Child(rid, proc, out_r, err_r)
        self.children[rid] = child
        for fd, stream in ((out_r, 1), (err_r, 2)):
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ, ("pipe", child))
            child.streams[fd] = stream
        if child.pidfd is not None:
            self.sel.register(child.pidfd, selectors.EVENT_READ, ("exit", child))
        self.send({"t": "started", "id": rid, "pid": proc.pid})


class Child:
    """One running command: its pipes, its exit watch."""

    def __init__(self, rid: int, proc: subprocess.Popen[bytes], out_r: int, err_r: int) -> None:
        self.rid = rid
        self.proc = proc
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

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)


def health() -> int:
    """The container's health check: this agent can start a command here (exec works, the pids
    limit is not used up, the filesystem answers)."""
    try:
        return subprocess.run(["true"], check=False, timeout=5).returncode
    except (OSError, subprocess.SubprocessError):
        return 1


def main() -> int:
    if sys.argv[1:] == ["--health"]:
        return health()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the orchestrator closed the stream
        Agent().serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
