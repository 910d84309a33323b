"""The agent's frames over two FIFOs, beside the engine instead of through it.

A frame through Docker's attached exec stream passes the engine's stream proxy both ways, so a
busy engine slows every command (1.6 ms a round trip under load against 0.1 ms over a FIFO). A
sandbox made with a link folder (a host folder of its own, bind-mounted read-only at
:data:`INSIDE`, mode 0711: nobody inside can list it) gets two FIFOs per agent, made just before
the agent starts:

- `<token>.up` (the agent writes, we read) and `<token>.down` (we write, the agent reads),
  owned by the agent's uid, mode 0600, named by 128 random bits;
- the token reaches the agent on its stdin (never in its command line), it opens both and
  answers `F` on stdout (or `S`: the frames stay on the stream);
- both names are unlinked as soon as both ends are open, so nothing else can open them later.

The exec stream stays open as the life line: closing it ends the agent, and the agent's stderr
still arrives there. Frames over the FIFOs are as hostile as over the stream: the link
(runtime/agent/link.py) checks them the same way. Where the FIFOs cannot be made for the agent's
uid (a non-numeric user, a non-root orchestrator, a remapped user namespace) the agent keeps the
stream, and so does every sandbox made without a link folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import anyio

from sandbox.runtime.agent.fd_stream import FdDuplex
from sandbox.runtime.agent.transport import AgentTransport

INSIDE = "/run/agent-link"  # where a sandbox sees its link folder
LINK_FLAG = "--link"  # the agent's argument: read the FIFOs' name from stdin first
VERDICT_TIMEOUT_S = 15.0  # the agent answers before its hello (python's start in a loaded sandbox)
LINKED, STAYED = b"F", b"S"


class LinkRefused(Exception):
    """The agent said something other than a verdict, or went away while linking."""


@dataclass(frozen=True)
class LinkPlace:
    """Where one agent's FIFOs are made: the host folder and how the agent sees it, and its uid."""

    host: Path
    inside: str
    uid: int


def wants_link(argv: list[str]) -> bool:
    """Whether `argv` starts an agent that waits for a link offer (AgentLink.open adds the flag
    last, for an image whose label says its agent takes it)."""
    return argv[-1:] == [LINK_FLAG]


def uid_of(user: str | None) -> int | None:
    """The numeric uid of a docker `user` ("1000" or "1000:1000"); None when it is a name."""
    head = (user or "").split(":", 1)[0]
    return int(head) if head.isdigit() else None


def can_own(uid: int) -> bool:
    """Whether this process can make a FIFO owned by `uid` (root can; anyone for itself)."""
    return os.geteuid() in (0, uid)


class FifoTransport(FdDuplex):
    """Frames over two FIFOs, the exec stream kept as the life line (an AgentTransport)."""

    def __init__(self, lifeline: AgentTransport, up: int, down: int) -> None:
        super().__init__(up, down)
        self.lifeline = lifeline

    @property
    def name(self) -> str:
        return f"{self.lifeline.name}+fifo"

    @property
    def stderr(self) -> bytes:
        drain = getattr(self.lifeline, "drain", None)  # nobody reads the life line otherwise
        if drain is not None and not self._closed:
            drain()
        return self.lifeline.stderr

    def ended(self) -> bool:
        return self._hung_up() or self.lifeline.ended()

    def close(self) -> None:
        if self._closed:
            return
        self.stderr  # noqa: B018 - kept before the stream closes: a dead link's log says what it said
        self._mark_closed()
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.lifeline.close()  # the agent's stdin ends: it exits


class _Replayed:
    """A transport whose first bytes were already read (the verdict's tail): they come first."""

    def __init__(self, inner: AgentTransport, head: bytes) -> None:
        self.inner = inner
        self._head = head

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def stderr(self) -> bytes:
        return self.inner.stderr

    async def receive(self, max_bytes: int) -> bytes:
        if self._head:
            data, self._head = self._head[:max_bytes], self._head[max_bytes:]
            return data
        return await self.inner.receive(max_bytes)

    async def send(self, data: bytes) -> None:
        await self.inner.send(data)

    def send_nowait(self, data: bytes) -> int:
        return self.inner.send_nowait(data)

    def ended(self) -> bool:
        return not self._head and self.inner.ended()

    def close(self) -> None:
        self.inner.close()


def unwrapped(transport: AgentTransport) -> AgentTransport:
    """The engine's own stream under a linked or replayed transport (what kills an agent)."""
    if isinstance(transport, FifoTransport):
        return unwrapped(transport.lifeline)
    if isinstance(transport, _Replayed):
        return unwrapped(transport.inner)
    return transport


async def offer_link(stream: AgentTransport, place: LinkPlace | None) -> AgentTransport:
    """Offer an agent started with :data:`LINK_FLAG` its FIFOs (none when `place` is None, or
    when they cannot be made) and return what its frames travel over: a :class:`FifoTransport`,
    or the stream itself.

    Raises:
        LinkRefused: the agent answered no verdict in time, or not one of ours (the stream is
            left to the caller to close).
        OSError: the FIFOs failed after the agent took them.
    """
    made = _make_fifos(place) if place is not None else None
    if made is None:
        await stream.send(b"\n")
        stayed = await _stayed(stream, linkable=False)
        assert stayed is not None
        return stayed
    assert place is not None
    token, up = made
    base = place.host / token
    paths = (Path(f"{base}.up"), Path(f"{base}.down"))
    down = -1
    try:
        await stream.send(f"{place.inside}/{token}\n".encode())
        stayed = await _stayed(stream, linkable=True)
        if stayed is not None:
            return stayed  # it could not open them: the frames stay on the stream
        try:
            # the agent holds `.down`'s read end now: a non-blocking open for writing succeeds
            down = os.open(paths[1], os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            raise LinkRefused("the agent said it linked, but holds no end of the FIFO") from None
        if not stat.S_ISFIFO(os.fstat(down).st_mode):
            raise LinkRefused("the link folder holds something other than our FIFO")
        transport = FifoTransport(stream, up, down)
        up = down = -1  # the transport's now
        return transport
    finally:
        for fd in (up, down):
            if fd >= 0:
                os.close(fd)
        _unlink(paths)


def _make_fifos(place: LinkPlace) -> tuple[str, int] | None:
    """Two FIFOs for one agent in `place`, and our read end of `.up` (open before the agent
    is told their name); None when they cannot be made (the agent keeps the stream). Made and
    owned through the folder's fd and their own, never by following a link."""
    token = secrets.token_hex(16)
    names = (f"{token}.up", f"{token}.down")
    try:
        folder = os.open(place.host, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    up = -1
    try:
        for name in names:
            os.mkfifo(name, 0o600, dir_fd=folder)
            # a read end opens at once (O_NONBLOCK); `.up`'s stays ours, `.down`'s only to own it
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            try:
                if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not our FIFO")
                os.fchown(fd, place.uid, -1)
                os.fchmod(fd, 0o600)  # mkfifo's mode passed the umask
            except BaseException:
                os.close(fd)
                raise
            if name.endswith(".up"):
                up = fd
            else:
                os.close(fd)
        return token, up
    except OSError:
        if up >= 0:
            os.close(up)
        _unlink((place.host / names[0], place.host / names[1]))
        return None
    finally:
        os.close(folder)


def _unlink(paths: tuple[Path, Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def _stayed(stream: AgentTransport, *, linkable: bool) -> AgentTransport | None:
    """Read the agent's one-byte verdict: None when it linked (its FIFOs are the caller's to
    open), else the stream to use, whatever followed the verdict replayed first."""
    first = b""
    with anyio.move_on_after(VERDICT_TIMEOUT_S):
        first = await stream.receive(4096)
    if not first:
        raise LinkRefused("the agent ended, or said nothing, before linking")
    verdict, rest = first[:1], first[1:]
    if verdict == LINKED and linkable:
        if rest:
            raise LinkRefused("the agent wrote frames to the stream after it linked")
        return None
    if verdict == STAYED:
        return _Replayed(stream, rest) if rest else stream
    raise LinkRefused(f"the agent answered {verdict!r} to the link offer, not a verdict")
