"""The agent as a local child process over pipes: a transport and a starter without an engine.

It runs the real agent program (images/sandbox/sandbox_agent.py) on this host, so the link's
own logic (request ids, multiplexing, timeouts, pings, hostile frames) is tested through the
same AgentLink the Docker path uses (tests/test_resident_agent.py). The pipes are read without
a thread, like Docker's socket: non-blocking, woken by the event loop.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from sandbox.runtime.agent.fd_stream import FdDuplex
from sandbox.runtime.agent.fifo_link import LinkPlace, LinkRefused, offer_link, unwrapped, wants_link
from sandbox.runtime.agent.frames import STDERR_KEPT
from sandbox.runtime.agent.link import AgentUnavailable
from sandbox.runtime.agent.transport import AgentTransport


class PipeTransport(FdDuplex):
    """A child process's stdin and stdout (an AgentTransport); its stderr is kept for the log."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        super().__init__(proc.stdout.fileno(), proc.stdin.fileno())
        self.proc = proc
        self._err = proc.stderr.fileno()
        os.set_blocking(self._err, False)
        self._stderr = bytearray()

    @property
    def name(self) -> str:
        return f"pid-{self.proc.pid}"

    @property
    def stderr(self) -> bytes:
        if not self._closed:
            with contextlib.suppress(OSError):  # what it wrote so far; nothing waits for more
                while chunk := os.read(self._err, 65536):
                    self._stderr = (self._stderr + chunk)[-STDERR_KEPT:]
        return bytes(self._stderr)

    def ended(self) -> bool:
        return self._hung_up()  # no data left, writer gone

    def close(self) -> None:
        if self._closed:
            return
        self.stderr  # noqa: B018 - kept before the pipe closes: a dead link's log says what it said
        self._mark_closed()
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()


class LocalAgents:
    """Starts agents as child processes of this one (an AgentStarter for tests: the container id
    and user are only recorded; the host's python stands in for the sandbox's)."""

    def __init__(
        self,
        labels: Mapping[str, str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
        link_folder: Path | None = None,
    ) -> None:
        self.labels = dict(labels) if labels is not None else None  # the "image"'s labels
        self._link_folder = link_folder  # an agent started with `--link` gets FIFOs here
        self._env = dict(env or {})
        self._preexec_fn = preexec_fn
        self.started: list[PipeTransport] = []
        self.killed: list[int] = []  # pids of agents killed through `kill`

    async def image_labels(self, image: str) -> dict[str, str] | None:
        return dict(self.labels) if self.labels is not None else None

    async def start(self, container_id: str, argv: list[str], user: str | None) -> AgentTransport:
        # Popen, not anyio.open_process: the link reads raw non-blocking fds, as Docker's socket
        proc = subprocess.Popen(  # noqa: ASYNC220 - a fork and exec, not a wait
            [sys.executable, *argv[1:]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **self._env},
            preexec_fn=self._preexec_fn,
        )
        transport = PipeTransport(proc)
        self.started.append(transport)
        if not wants_link(argv):
            return transport
        folder = self._link_folder
        place = LinkPlace(folder, str(folder), os.geteuid()) if folder is not None else None
        try:
            return await offer_link(transport, place)
        except (LinkRefused, OSError) as exc:
            transport.close()
            raise AgentUnavailable(f"the agent's link could not be set up: {exc}") from exc

    async def kill(self, container_id: str, transport: AgentTransport) -> None:
        transport = unwrapped(transport)
        if isinstance(transport, PipeTransport) and transport.proc.poll() is None:
            transport.proc.kill()
            self.killed.append(transport.proc.pid)

    def reap(self) -> None:
        """Close every agent's pipes and wait for it (the end of a test)."""
        for transport in self.started:
            transport.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                transport.proc.wait(timeout=10)
            if transport.proc.poll() is None:
                transport.proc.kill()
                transport.proc.wait()
