"""One persistent stream to a sandbox's resident agent, and calls over it.

The agent is started once per (container, user) by its engine (an AgentStarter: Docker's
attached `docker exec -i`, or a local subprocess in tests); afterwards a command is a request
frame written to its stdin and answers read from its stdout: no engine API call. The bytes go
over an AgentTransport (runtime/agent/transport.py); everything about frames is here.
Whoever waits for an answer reads the stream (one reader at a time; the others wait for what
it dispatches), so no thread or background task is needed and a cancelled caller simply stops
waiting.

What the agent says is checked (runtime/agent/frames.py) and bounded in time: no hello, no
`started` answer, a stalled stdin, a broken frame or the stream's end all mark the link dead
with the reason. Every call waiting on a dead link fails at once with AgentUnavailable (a
SANDBOX_UNAVAILABLE); the next call starts a fresh agent. The sandbox itself is kept.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel

from sandbox._log import logger
from sandbox.errors import PortUnreachable, SandboxUnavailable
from sandbox.runtime.agent.exec_path import PROTOCOL
from sandbox.runtime.agent.fifo_link import LINK_FLAG
from sandbox.runtime.agent.frames import (
    PORT_FRAMES,
    Data,
    Exit,
    Failed,
    FileInfo,
    FileRefused,
    FrameError,
    FrameReader,
    Hello,
    Out,
    PortData,
    Reply,
    Started,
)
from sandbox.runtime.agent.frames import encode as encode_frame
from sandbox.runtime.agent.ports import OPEN_TIMEOUT_S, PortTunnel
from sandbox.runtime.agent.transport import AgentStarter, AgentTransport
from sandbox.runtime.output import OutputCapture
from sandbox.runtime.protocol import ExecResult

HELLO_TIMEOUT_S = 15.0  # python's start in a loaded sandbox
ANSWER_TIMEOUT_S = 10.0  # a request's first answer (`started`, `pong`, `done`)
WRITE_TIMEOUT_S = 10.0  # the agent not reading its stdin for this long ends the link
FILE_TIMEOUT_S = 60.0  # a file operation's answer (16 MiB through a loaded sandbox)
RECV = 64 << 10
# frames handled before the event loop gets a turn: a flood of tiny frames from a hostile agent
# costs CPU, never a stall of other tenants' calls
FRAMES_PER_TURN = 128


class AgentUnavailable(SandboxUnavailable):
    """The resident agent failed (killed, stopped, or broke the protocol); the sandbox is kept."""


@dataclass
class _Pending:
    """One request in flight: what arrived for it so far."""

    id: int
    capture: OutputCapture | None = None
    on_output: Callable[[bytes], None] | None = None
    answered: bool = False
    pid: int = 0
    exit: Exit | None = None
    error: str | None = None
    data: bytearray = field(default_factory=bytearray)  # a file request's bytes
    data_limit: int = 0  # the most a file request may be sent back
    reply: FileInfo | FileRefused | Reply | None = None  # a file request's answer


class AgentLink:
    """A live stream to one agent. Make it with :meth:`open`."""

    def __init__(self, transport: AgentTransport, container_id: str, user: str | None) -> None:
        self.transport = transport
        self.container_id = container_id
        self.user = user
        self.agent_pid = 0  # the agent's pid inside the container (its hello says)
        self.dead: str | None = None  # why the link ended, once it has
        self._reader = FrameReader()
        self._pending: dict[int, _Pending] = {}
        self._next = 1
        self._reading = False
        self._changed = anyio.Event()
        self._write_lock = anyio.Lock()
        self._hello: Hello | None = None
        self._tagged: dict[str, int] = {}  # a call id -> its last request's id (for the signal frame)
        self._ports: dict[int, PortTunnel] = {}  # open connections to the sandbox's loopback ports

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    async def open(
        cls, starter: AgentStarter, container_id: str, agent_path: str, user: str | None, *, link: bool = False
    ) -> AgentLink:
        """Start the agent in the container and wait for its hello (`link`: the agent takes
        `--link`, and the starter may move its frames to FIFOs, runtime/agent/fifo_link.py).

        Raises:
            SandboxGone: the container is gone or stopped (from the starter).
            AgentUnavailable: the agent did not start or did not greet in time.
        """
        argv = ["/usr/bin/python3", "-I", "-S", agent_path, *([LINK_FLAG] if link else [])]
        transport = await starter.start(container_id, argv, user)
        return await cls.greeted(transport, container_id, user)

    @classmethod
    async def greeted(cls, transport: AgentTransport, container_id: str, user: str | None) -> AgentLink:
        """A link over a started agent's `transport`, once the agent said hello.

        Raises:
            AgentUnavailable: the agent did not greet in time, or speaks another protocol.
        """
        link = cls(transport, container_id, user)
        try:
            with anyio.move_on_after(HELLO_TIMEOUT_S):
                await link._wait(lambda: link._hello is not None)
        except BaseException:  # cancelled while it started: the stream closes, the agent exits
            link.close("the caller stopped waiting for the agent to start")
            raise
        if link._hello is None:
            reason = link.dead or f"the agent did not greet within {HELLO_TIMEOUT_S:.0f} s"
            link.close(reason)
            raise AgentUnavailable(f"the resident agent did not start: {reason}")
        if link._hello.protocol != PROTOCOL:
            link.close("protocol mismatch")
            raise AgentUnavailable(f"the agent speaks protocol {link._hello.protocol}, not {PROTOCOL}")
        link.agent_pid = link._hello.pid
        return link

    # -- calls -----------------------------------------------------------------------------

    async def run(
        self,
        argv: Sequence[str],
        *,
        environment: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout_s: float | None = None,
        on_output: Callable[[bytes], None] | None = None,
        capture: OutputCapture | None = None,
        tag: str | None = None,
        pid_file: str | None = None,
        pid_dir_mode: int | None = None,
    ) -> ExecResult:
        """Run argv through the agent, like `exec_stream` does through the engine.

        Stopping the wait (timeout, cancellation, output past the capture's maximum) does not
        stop the command: callers that own a call id kill it (`tag`: the call id, so
        :meth:`signal_tagged` can reach the command's process group). `pid_file`: the command's
        wrapper's, which the agent removes once the command is over and its group empty;
        `pid_dir_mode`: the mode the agent makes its folder with when it is missing.
        """
        capture = capture or OutputCapture()
        start = time.perf_counter()
        call = self._new(capture=capture, on_output=on_output)
        if tag is not None:
            self._tagged.pop(tag, None)
            self._tagged[tag] = call.id
            while len(self._tagged) > 256:  # the oldest go: their commands are long over
                del self._tagged[next(iter(self._tagged))]
        request: dict[str, Any] = {
            "t": "run", "id": call.id, "argv": list(argv), "env": dict(environment or {}), "cwd": workdir,
        }  # fmt: skip
        if pid_file is not None:
            request["pid_file"] = pid_file
            if pid_dir_mode is not None:
                request["pid_dir_mode"] = pid_dir_mode
        timed_out = False
        try:
            await self._send(request)
            await self._answer(call)
            with anyio.move_on_after(timeout_s) as scope:
                await self._wait(lambda: call.exit is not None or call.error is not None or capture.overflowed)
            timed_out = scope.cancelled_caught
        finally:
            self._pending.pop(call.id, None)
        self._raise_if_failed(call)
        if timed_out and self.dead is None:
            # a command that outlived its time, or an agent that stopped answering? Asked now,
            # so a stuck agent costs this call, not the next one
            with contextlib.suppress(AgentUnavailable):
                await self.ping()
        exit_code = call.exit.code if call.exit is not None and not timed_out and not capture.overflowed else None
        return ExecResult.from_capture(
            capture, exit_code=exit_code, duration_ms=(time.perf_counter() - start) * 1000, timed_out=timed_out
        )

    async def file_request(
        self, header: dict[str, Any], chunks: Sequence[bytes] = (b"",), *, data_limit: int = 0
    ) -> tuple[FileInfo | FileRefused | Reply, bytes]:
        """One file operation (runtime/agent/files.py): the request (its payload in `chunks`, one
        frame each), then what the agent sent back (bytes up to `data_limit`) and its answer."""
        call = self._new(data_limit=data_limit)
        try:
            for index, chunk in enumerate(chunks):
                last = index == len(chunks) - 1
                await self._send({**header, "id": call.id, "first": index == 0, "last": last}, chunk)
            with anyio.move_on_after(FILE_TIMEOUT_S):
                await self._wait(lambda: call.reply is not None or call.error is not None)
            if call.reply is None and call.error is None:
                self._fail(f"the agent did not answer file request {call.id} within {FILE_TIMEOUT_S:.0f} s")
        finally:
            self._pending.pop(call.id, None)
        self._raise_if_failed(call)
        assert call.reply is not None
        return call.reply, bytes(call.data)

    async def signal(self, target: int, signum: int) -> None:
        """Signal the process group of a running request (`target`: its id)."""
        call = self._new()
        try:
            await self._send({"t": "signal", "id": call.id, "target": target, "sig": signum})
            await self._answer(call)
        finally:
            self._pending.pop(call.id, None)
        self._raise_if_failed(call)

    async def signal_tagged(self, tag: str, signum: int) -> bool:
        """The signal frame to the process group of the last command run with `tag` (False: none
        was run on this link). The agent ignores a target that has ended."""
        target = self._tagged.get(tag)
        if target is None:
            return False
        await self.signal(target, signum)
        return True

    async def ping(self) -> float:
        """One round trip to the agent, in ms."""
        start = time.perf_counter()
        call = self._new()
        try:
            await self._send({"t": "ping", "id": call.id})
            await self._answer(call)
        finally:
            self._pending.pop(call.id, None)
        self._raise_if_failed(call)
        return (time.perf_counter() - start) * 1000

    async def open_port(self, port: int) -> PortTunnel:
        """A connection to `port` on the sandbox's own loopback, carried by this agent
        (runtime/agent/ports.py); close it with `aclose` (or use it as a context manager).

        Raises:
            PortUnreachable: nothing listens there, the server runs as another user, too many
                connections are open, or this agent cannot carry ports (an older image).
            AgentUnavailable: the agent did not answer in time, or the link died.
        """
        if self._hello is not None and not self._hello.ports:
            raise PortUnreachable(
                "no_relay", "this sandbox's agent cannot carry ports (an older image): run `sandbox images build`"
            )
        call = self._new()  # an id (and a pending entry that only the link's death fills)
        tunnel = self._ports[call.id] = PortTunnel(self, call.id, port)
        try:
            await self._send({"t": "popen", "id": call.id, "port": port})
            with anyio.move_on_after(OPEN_TIMEOUT_S):
                await self._wait(lambda: tunnel.opened or tunnel.refused is not None or call.error is not None)
            if not tunnel.opened and tunnel.refused is None and call.error is None:
                self._fail(f"the agent did not answer port request {call.id} within {OPEN_TIMEOUT_S:.0f} s")
            self._raise_if_failed(call)
        except BaseException:
            self._ports.pop(call.id, None)
            if self.dead is None:  # cancelled after asking: the agent may open it, so it closes it
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await self.send_port({"t": "pclose", "id": call.id}, quiet=True)
            raise
        finally:
            self._pending.pop(call.id, None)
        if tunnel.refused is not None:
            self._ports.pop(call.id, None)
            raise PortUnreachable(tunnel.refused.why, tunnel.refused.message)
        return tunnel

    async def wait_port(self, done: Callable[[], bool]) -> None:
        """Until `done()` (a tunnel's condition); AgentUnavailable when the link died first."""
        await self._wait(done)
        if not done():
            raise AgentUnavailable(f"the sandbox's agent is gone: {self.dead}")

    async def send_port(self, header: dict[str, Any], payload: bytes = b"", *, quiet: bool = False) -> None:
        """One frame of a tunnel (`quiet`: a dead link is no error, for a close)."""
        try:
            await self._send(header, payload)
        except AgentUnavailable:
            if not quiet:
                raise

    def forget_port(self, rid: int) -> None:
        """A tunnel was closed: frames that still arrive for it are dropped."""
        self._ports.pop(rid, None)

    def check(self) -> bool:
        """Whether the link still looks alive, without waiting: a stream the engine already
        ended (the container stopped, the agent died while idle) is found dead before a request
        is sent on it, so that request can go to a new container or agent instead."""
        if self.dead is None and not self._reading:
            try:
                if self.transport.ended():
                    self._fail(self._ended())
            except (OSError, ValueError) as exc:
                self._fail(f"the agent's stream failed: {exc}")
        return self.dead is None

    def close(self, reason: str = "closed") -> None:
        """End the link: the agent sees its stdin end and exits; waiting calls fail."""
        if self.dead is None:
            self._fail(reason)

    # -- plumbing --------------------------------------------------------------------------

    def _new(self, **kwargs: Any) -> _Pending:
        if self.dead is not None:
            raise AgentUnavailable(f"the sandbox's agent is gone: {self.dead}")
        call = _Pending(self._next, **kwargs)
        self._next += 1
        self._pending[call.id] = call
        return call

    async def _answer(self, call: _Pending) -> None:
        # an agent that takes a request and never answers is stopped or lying: the link ends
        with anyio.move_on_after(ANSWER_TIMEOUT_S):
            await self._wait(lambda: call.answered or call.error is not None)
        if not call.answered and call.error is None:
            self._fail(f"the agent did not answer request {call.id} within {ANSWER_TIMEOUT_S:.0f} s")

    def _raise_if_failed(self, call: _Pending) -> None:
        if call.error is not None:
            raise AgentUnavailable(call.error)

    async def _send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        data = encode_frame(header, payload)
        async with self._write_lock:
            if self.dead is not None:
                raise AgentUnavailable(f"the sandbox's agent is gone: {self.dead}")
            with anyio.move_on_after(WRITE_TIMEOUT_S) as scope:
                try:
                    await self._send_reading(data)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    self._fail("the link was closed while a request was being written")
                    raise AgentUnavailable(f"the sandbox's agent is gone: {self.dead}") from None
                except OSError as exc:
                    self._fail(f"writing to the agent failed: {exc}")
                    raise AgentUnavailable(f"the sandbox's agent is gone: {self.dead}") from None
            if scope.cancelled_caught:
                self._fail(f"the agent did not read its requests for {WRITE_TIMEOUT_S:.0f} s")
                raise AgentUnavailable(f"the sandbox's agent is gone: {self.dead}")

    async def _send_reading(self, data: bytes) -> None:
        """Write `data`, reading the stream meanwhile: an agent whose output nobody read (a preview
        whose browser stalled, a command nobody waits for) is blocked writing it and reads no
        request until its output is taken. What is read is dispatched as always, and bounded
        (the tunnels' windows, the captures' maxima).

        A request that fits in the stream's buffer (nearly all) is written at once: no task, no
        wait."""
        taken = self.transport.send_nowait(data)
        if taken >= len(data):
            return
        data = data[taken:]
        sent = False

        async def drain() -> None:
            await self._wait(lambda: sent)

        failed: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            try:
                await self.transport.send(data)
            except Exception as exc:  # raised as itself below, not inside the group's ExceptionGroup
                failed = exc
            finally:
                sent = True
                tg.cancel_scope.cancel()
        if failed is not None:
            raise failed

    async def _wait(self, done: Callable[[], bool]) -> None:
        """Until `done()` or the link is dead: read the stream, or wait for whoever reads it."""
        while not done() and self.dead is None:
            if self._reading:
                await self._changed.wait()
                continue
            self._reading = True
            try:
                try:
                    data = await self.transport.receive(RECV)
                except anyio.ClosedResourceError:
                    continue  # the link was closed meanwhile: `dead` says why
                except OSError as exc:
                    self._fail(f"reading from the agent failed: {exc}")
                    continue
                except ValueError as exc:  # the transport's own framing broke (FrameError is one)
                    self._fail(str(exc))
                    continue
                if not data:
                    self._fail(self._ended())
                else:
                    with anyio.CancelScope(shield=True):  # a frame read is always dispatched whole
                        await self._dispatch(data)
            finally:
                self._reading = False
                changed, self._changed = self._changed, anyio.Event()
                changed.set()

    async def _dispatch(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except FrameError as exc:
            self._fail(str(exc))
            return
        for index, (frame, payload) in enumerate(frames):
            if index and index % FRAMES_PER_TURN == 0:
                await anyio.lowlevel.checkpoint()
            if self.dead is not None:
                return
            if frame.id >= self._next:
                self._fail(f"the agent answered request {frame.id}, which was never made")
                return
            if isinstance(frame, (Out, Data, PortData)) and not payload:
                self._fail(f"the agent sent an empty {frame.t!r} frame (never sent by a working agent)")
                return
            if isinstance(frame, Hello):
                if self._hello is not None:
                    self._fail("the agent greeted twice")
                    return
                self._hello = frame
                continue
            if isinstance(frame, Failed) and frame.id == 0:
                self._fail(f"the agent reported: {frame.message}")
                return
            if isinstance(frame, PORT_FRAMES):
                tunnel = self._ports.get(frame.id)
                broken = tunnel.on_frame(frame, payload) if tunnel is not None else None
                if broken:
                    self._fail(broken)
                    return
                continue  # a closed tunnel's late frames are dropped
            call = self._pending.get(frame.id)
            if call is None:
                continue  # an answer to a call that stopped waiting (timed out, cancelled)
            if isinstance(frame, Started):
                call.answered, call.pid = True, frame.pid
            elif isinstance(frame, Out):
                if call.capture is None or not call.answered:
                    self._fail(f"the agent sent output for request {frame.id}, which is not a started command")
                    return
                if call.capture.add(frame.stream, payload) and call.on_output is not None:
                    with contextlib.suppress(Exception):  # a progress listener's fault is not the call's
                        call.on_output(payload)
            elif isinstance(frame, Exit):
                if not call.answered:
                    self._fail(f"the agent reported an exit for request {frame.id} before it started")
                    return
                call.exit = frame
            elif isinstance(frame, Data):
                if len(call.data) + len(payload) > call.data_limit:
                    self._fail(f"the agent sent more than the {call.data_limit} bytes asked for request {frame.id}")
                    return
                call.data += payload
            elif isinstance(frame, (FileInfo, FileRefused)):
                call.reply = frame
            elif isinstance(frame, Reply):
                call.answered = True
                call.reply = frame
            elif isinstance(frame, Failed):
                call.error = f"the agent refused the request: {frame.message}"

    def _ended(self) -> str:
        tail = bytes(self.transport.stderr).decode(errors="replace").strip()[-300:]
        return "the agent's stream ended (it exited or was killed)" + (f"; it said: {tail}" if tail else "")

    def _fail(self, reason: str) -> None:
        if self.dead is not None:
            return
        self.dead = reason
        bound = logger.bind(container=self.container_id[:12], exec_id=self.transport.name[:12])
        bound.info("agent_link_ended", reason=reason)
        for call in self._pending.values():
            call.error = (
                f"the sandbox's agent stopped during the call ({reason}); the command was stopped, the "
                "sandbox is kept, and the next call starts a new agent"
            )
        self.transport.close()  # a reader or writer waiting on it wakes (ClosedResourceError)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
