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
import pytest

from sandbox.runtime.agent import fifo_link
from sandbox.runtime.agent.exec_path import AGENT_LABEL, AGENT_LINK_LABEL, AGENT_PROTOCOL_LABEL, path_from_labels
from sandbox.runtime.agent.fifo_link import FifoTransport, LinkPlace, LinkRefused, offer_link, uid_of
from sandbox.runtime.agent.link import AgentLink, AgentUnavailable
from sandbox.runtime.agent.pipe import LocalAgents, PipeTransport
from sandbox.runtime.agent.resident import ResidentAgents
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
