"""The agent's frames over two FIFOs (runtime/agent/fifo_link.py), the stream kept as the life
line: driven over the pipe transport with the real agent program (or a hostile stand-in) as a
child process of the test. No engine: what is tested is the hand-over (the token on stdin, the
one-byte verdict, names unlinked once open), the fallbacks to the stream, and what a lying or
dying agent does to its link. tests/test_agent_fifo_link_docker.py does it in real sandboxes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from sandbox.runtime import link_folders
from sandbox.runtime.agent import fifo_link
from sandbox.runtime.agent.exec_path import AGENT_LABEL, AGENT_LINK_LABEL, AGENT_PROTOCOL_LABEL, path_from_labels
from sandbox.runtime.agent.fifo_link import FifoTransport, LinkPlace, LinkRefused, offer_link, uid_of
from sandbox.runtime.agent.link import AgentLink, AgentUnavailable
from sandbox.runtime.agent.pipe import LocalAgents, PipeTransport
from sandbox.runtime.agent.resident import ResidentAgents
from sandbox.runtime.docker.agent_links import folder_in
from sandbox.runtime.naming import Labels
from tests.test_agent_link_pipe import AGENT, a_spec

pytestmark = pytest.mark.anyio

LABELS = {AGENT_LABEL: str(AGENT), AGENT_PROTOCOL_LABEL: "1", AGENT_LINK_LABEL: "fifo"}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    made = tmp_path / "link"
    made.mkdir(mode=0o711)
    return made


@pytest.fixture
async def agents(folder: Path) -> AsyncIterator[LocalAgents]:
    starter = LocalAgents(LABELS, link_folder=folder)
    yield starter
    starter.reap()


def fds_of(pid: int) -> list[str]:
    return [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]


async def test_frames_move_to_fifos_whose_names_are_gone_once_open(agents: LocalAgents, folder: Path) -> None:
    link = await AgentLink.open(agents, "container-id", str(AGENT), None, link=True)
    try:
        assert isinstance(link.transport, FifoTransport)
        assert os.listdir(folder) == []  # nothing left to open by name
        result = await link.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
        assert (result.exit_code, result.stdout, result.stderr) == (7, b"out\n", b"err\n")
        assert await link.ping() >= 0
        # the agent holds both FIFOs (unlinked), its stdin and stdout stay the engine's stream
        held = fds_of(link.agent_pid)
        assert sum(".up" in f or ".down" in f for f in held) == 2, held
    finally:
        link.close()


async def test_a_command_inherits_no_end_of_the_link(agents: LocalAgents) -> None:
    link = await AgentLink.open(agents, "container-id", str(AGENT), None, link=True)
    try:
        listed = await link.run(["sh", "-c", "ls -l /proc/$$/fd"])
        assert listed.exit_code == 0 and b"->" in listed.stdout
        assert b".up" not in listed.stdout and b".down" not in listed.stdout, listed.stdout
    finally:
        link.close()


async def test_without_a_folder_the_frames_stay_on_the_stream() -> None:
    agents = LocalAgents(LABELS)  # no link folder: the agent is told so by an empty line
    try:
        link = await AgentLink.open(agents, "container-id", str(AGENT), None, link=True)
        assert isinstance(link.transport, PipeTransport | fifo_link._Replayed)
        assert (await link.run(["sh", "-c", "echo on the stream"])).stdout == b"on the stream\n"
        link.close()
    finally:
        agents.reap()


async def test_fifos_the_agent_cannot_open_leave_it_on_the_stream(folder: Path) -> None:
    """The folder as the agent sees it is not there (an engine that mounted nothing, a remapped
    uid): the agent answers `S`, our FIFOs are unlinked, and the link works over the stream."""
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = subprocess.Popen([sys.executable, str(AGENT), fifo_link.LINK_FLAG], **pipes)  # type: ignore[call-overload]
    try:
        place = LinkPlace(folder, "/nonexistent/agent-link", os.geteuid())
        transport = await offer_link(PipeTransport(proc), place)
        assert not isinstance(transport, FifoTransport)
        assert os.listdir(folder) == []
        link = await AgentLink.greeted(transport, "container-id", None)
        assert (await link.run(["true"])).exit_code == 0
        link.close()
    finally:
        proc.kill()
        proc.wait()


async def test_a_killed_agent_ends_its_link_and_the_registry_starts_a_linked_one(
    agents: LocalAgents, tmp_path: Path
) -> None:
    registry = ResidentAgents(agents)
    spec = a_spec(tmp_path)
    first = await registry.link("container-id", spec, None)
    assert first is not None and isinstance(first.transport, FifoTransport)
    os.kill(first.agent_pid, signal.SIGKILL)
    with anyio.fail_after(10):
        while first.check():
            await anyio.sleep(0.02)
    assert "ended" in (first.dead or ""), first.dead
    second = await registry.link("container-id", spec, None)
    assert second is not None and second is not first and isinstance(second.transport, FifoTransport)
    assert (await second.run(["sh", "-c", "echo again"])).stdout == b"again\n"


async def test_closing_the_link_ends_the_agent(agents: LocalAgents) -> None:
    link = await AgentLink.open(agents, "container-id", str(AGENT), None, link=True)
    proc = agents.started[-1].proc
    link.close()
    with anyio.fail_after(10):
        while proc.poll() is None:
            await anyio.sleep(0.02)
    assert proc.returncode == 0


def stand_in(tmp_path: Path, body: str) -> str:
    """A lying agent: reads the FIFOs' name from stdin, then runs `body` (`name`: what it read)."""
    script = tmp_path / "liar.py"
    script.write_text(
        "import os, struct, sys\nname = sys.stdin.buffer.readline().decode().strip()\n"
        "def w(b): sys.stdout.buffer.write(b); sys.stdout.buffer.flush()\n" + body + "\nsys.stdin.buffer.read()\n"
    )
    return str(script)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("w(b'F')", "holds no end"),  # says it linked, opened nothing
        ("w(b'X')", "not a verdict"),
        ("w(b'F' + struct.pack('>II', 2, 0) + b'{}')", "frames to the stream after it linked"),
        ("pass", "said nothing"),  # never answers (the verdict's time is cut short below)
        ("sys.exit(0)", "ended"),
    ],
)
@pytest.mark.slow
async def test_a_lying_agent_is_refused_and_leaves_no_fifo(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch, body: str, words: str
) -> None:
    monkeypatch.setattr(fifo_link, "VERDICT_TIMEOUT_S", 0.5)
    agents = LocalAgents(LABELS, link_folder=folder)
    try:
        with pytest.raises(AgentUnavailable, match=words):
            await AgentLink.open(agents, "container-id", stand_in(tmp_path, body), None, link=True)
        assert os.listdir(folder) == []
    finally:
        agents.reap()


async def test_a_verdict_to_an_empty_offer_cannot_claim_a_link() -> None:
    class Said:
        """A stream whose agent answered `F` although it was offered no FIFOs."""

        name, stderr = "said", b""

        async def receive(self, max_bytes: int) -> bytes:
            return b"F"

        async def send(self, data: bytes) -> None:
            assert data == b"\n"

    with pytest.raises(LinkRefused, match="not a verdict"):
        await offer_link(Said(), None)  # type: ignore[arg-type]


def test_uids_come_only_from_numbers() -> None:
    assert uid_of("1000:1000") == 1000 and uid_of("54829") == 54829
    assert uid_of("sandbox") is None and uid_of("") is None and uid_of(None) is None


def test_only_an_image_that_says_so_is_offered_the_link() -> None:
    assert path_from_labels(LABELS, "auto").link
    assert not path_from_labels({AGENT_LABEL: "/a.py", AGENT_PROTOCOL_LABEL: "1"}, "auto").link
    assert not path_from_labels(LABELS, "off").link


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
async def test_refused_and_cancelled_links_leave_no_fd_and_no_fifo(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fifo_link, "VERDICT_TIMEOUT_S", 30.0)
    agents = LocalAgents(LABELS, link_folder=folder)
    try:
        await AgentLink.open(agents, "warm-up", str(AGENT), None, link=True)  # lazily opened things
        before = open_fds()
        for body in ("w(b'F')", "w(b'X')"):
            with pytest.raises(AgentUnavailable):
                await AgentLink.open(agents, "container-id", stand_in(tmp_path, body), None, link=True)
        with anyio.move_on_after(0.5) as waited:  # an agent that never answers, and a caller who gives up
            await AgentLink.open(agents, "container-id", stand_in(tmp_path, "pass"), None, link=True)
        assert waited.cancelled_caught
        for transport in agents.started[1:]:
            transport.close()  # the pipes of the stand-ins (what the starter's caller closes)
        assert os.listdir(folder) == [] and open_fds() == before
    finally:
        agents.reap()


async def test_a_receive_woken_before_close_never_reads_the_fd_number_reused() -> None:
    """FIFO ends are plain fd numbers: once closed, the next open gets the same number (another
    agent's FIFO). A receive whose wait had already been woken when `close` ran must fail, not
    read what the new file holds."""

    class Lifeline:
        name, stderr = "lifeline", b""

        def ended(self) -> bool:
            return False

        def close(self) -> None:
            pass

    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    transport = FifoTransport(Lifeline(), up_r, down_w)  # type: ignore[arg-type]
    outcome: list[object] = []

    async def receive() -> None:
        try:
            outcome.append(await transport.receive(100))
        except anyio.ClosedResourceError:
            outcome.append("closed")

    async with anyio.create_task_group() as tg:
        tg.start_soon(receive)
        await anyio.wait_all_tasks_blocked()
        os.write(up_w, b"ours")  # the wait is woken: in the loop's next round its task is due...
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()  # ...after this one, which runs first:
        transport.close()  # the link is closed before the woken task runs
        other_r, other_w = os.pipe()  # the same number now: another agent's FIFO
        os.write(other_w, b"ANOTHER TENANT'S FRAME")
    assert outcome == ["closed"], outcome
    for fd in (up_w, down_r, other_r, other_w):
        os.close(fd)
    with pytest.raises(anyio.ClosedResourceError):
        transport.send_nowait(b"x")
    assert transport.ended()


def test_the_folder_is_read_from_the_mounts_and_only_when_shaped_like_ours(tmp_path: Path) -> None:
    """An image's labels merge into the container's: a label naming a folder is never believed.
    Only a read-only bind at /run/agent-link of `<...>/agent-links/<32 hex>` is a link folder."""
    ours = f"{tmp_path}/state/agent-links/{'a' * 32}"

    def attrs(source: str, rw: bool = False, dest: str = fifo_link.INSIDE) -> dict[str, object]:
        mount = {"Type": "bind", "Source": source, "Destination": dest, "RW": rw}
        return {"Config": {"Labels": {Labels.AGENT_LINK: "/etc"}}, "Mounts": [mount]}

    assert folder_in(attrs(ours)) == ours
    assert folder_in({"Config": {"Labels": {Labels.AGENT_LINK: ours}}, "Mounts": []}) is None  # a label alone
    assert folder_in(attrs(ours, rw=True)) is None
    assert folder_in(attrs(ours, dest="/workspace")) is None
    assert folder_in(attrs("/etc")) is None and folder_in(attrs(f"/etc/{'a' * 32}")) is None


def test_removal_touches_only_fifos_in_a_folder_shaped_like_ours(tmp_path: Path) -> None:
    elsewhere = tmp_path / "precious" / ("b" * 32)  # named like ours, not in an agent-links folder
    elsewhere.mkdir(parents=True)
    (elsewhere / "data.txt").write_text("keep")
    link_folders.remove(elsewhere)
    assert (elsewhere / "data.txt").read_text() == "keep"
    root = tmp_path / "agent-links"
    folder = link_folders.make(str(root))
    os.mkfifo(folder / "x.up")
    (folder / "planted.txt").write_text("not a FIFO")
    link_folders.remove(folder)
    assert sorted(os.listdir(folder)) == ["planted.txt"]  # the FIFO went, the rest and the folder stay
    (folder / "planted.txt").unlink()
    link_folders.remove(folder)
    assert not folder.exists()
    target = link_folders.make(str(root))
    link = root / ("c" * 32)
    link.symlink_to(target)
    os.mkfifo(target / "y.up")
    link_folders.remove(link)  # never through a link
    assert os.listdir(target) == ["y.up"]
