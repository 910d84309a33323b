"""The orchestrator's AgentLink and its registry (ResidentAgents), the classes the Docker path
uses, driven over the pipe transport (runtime/agent/pipe.py): the real agent program, or a
hostile stand-in, as a child process of the test. No engine: what is tested is the link's own
logic (request ids, multiplexing, timeouts, pings, hostile frames, a dead agent replaced)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.config import effective_agent, load_config_text
from sandbox.runtime.agent import link as agent_link
from sandbox.runtime.agent import resident
from sandbox.runtime.agent.exec_path import AGENT_LABEL, AGENT_PROTOCOL_LABEL
from sandbox.runtime.agent.link import AgentLink, AgentUnavailable
from sandbox.runtime.agent.pipe import LocalAgents
from sandbox.runtime.agent.resident import ResidentAgents
from sandbox.runtime.output import OutputCapture
from sandbox.runtime.spec import SandboxSpec, build_spec

pytestmark = pytest.mark.anyio

AGENT = Path(__file__).resolve().parents[1] / "images/sandbox/sandbox_agent.py"
LABELS = {AGENT_LABEL: str(AGENT), AGENT_PROTOCOL_LABEL: "1"}


@pytest.fixture
async def agents() -> AsyncIterator[LocalAgents]:
    starter = LocalAgents(LABELS)
    yield starter
    starter.reap()


@pytest.fixture
async def link(agents: LocalAgents) -> AsyncIterator[AgentLink]:
    opened = await AgentLink.open(agents, "container-id", str(AGENT), None)
    yield opened
    opened.close()


def a_spec(tmp_path: Path) -> SandboxSpec:
    """A real sandbox spec (its image's labels come from LocalAgents, not an engine)."""
    config = load_config_text(f"state_dir: {tmp_path / 'state'}\n")
    return build_spec(effective_agent(config, "main"), "agent:main:s", "inst1")


def hostile(tmp_path: Path, body: str) -> str:
    """A stand-in agent: greets like the real one, then runs `body` (w: write raw bytes)."""
    script = tmp_path / "hostile_agent.py"
    script.write_text(
        "import json, os, struct, sys, time\n"
        "def w(b): sys.stdout.buffer.write(b); sys.stdout.buffer.flush()\n"
        "def frame(h, p=b''): h = json.dumps(h).encode(); return struct.pack('>II', len(h), len(p)) + h + p\n"
        "w(frame({'t': 'hello', 'id': 0, 'protocol': 1, 'pid': os.getpid(), 'pidfd': False}))\n"
        "sys.stdin.buffer.read(8)\n" + body
    )
    return str(script)


async def test_the_link_runs_commands_over_pipes_with_both_outputs_and_the_exit(link: AgentLink) -> None:
    assert link.agent_pid > 0
    result = await link.run(["sh", "-c", "echo out; echo err >&2; exit 7"], environment={"X": "1"})
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (7, b"out\n", b"err\n", False)
    assert await link.ping() >= 0


@pytest.mark.slow
async def test_concurrent_calls_are_multiplexed_by_request_id(link: AgentLink) -> None:
    results: dict[str, bytes] = {}

    async def one(word: str, delay: str) -> None:
        results[word] = (await link.run(["sh", "-c", f"sleep {delay}; echo {word}"])).stdout

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "slow", "0.3")
        tg.start_soon(one, "fast", "0")
        tg.start_soon(link.ping)
    assert results == {"slow": b"slow\n", "fast": b"fast\n"}
    assert link.dead is None


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_command_past_its_time_is_a_timeout_and_the_link_lives_on(link: AgentLink) -> None:
    result = await link.run(["sleep", "30"], timeout_s=0.3)
    assert result.timed_out and result.exit_code is None
    assert link.dead is None and (await link.run(["true"])).exit_code == 0


async def test_output_past_the_capture_stops_the_wait(link: AgentLink) -> None:
    capture = OutputCapture(max_bytes=1000)
    result = await link.run(["sh", "-c", "head -c 100000 /dev/zero; sleep 30"], capture=capture)
    assert result.overflowed and result.exit_code is None and link.dead is None


async def test_file_requests_round_trip(link: AgentLink, tmp_path: Path) -> None:
    header = {"t": "fwrite", "root": str(tmp_path), "parts": ["f.txt"], "mode": 0o600}
    wrote, _ = await link.file_request(header, [b"ab", b"cd"])
    assert wrote.t == "file" and (tmp_path / "f.txt").read_bytes() == b"abcd"
    read, data = await link.file_request(
        {"t": "fread", "root": str(tmp_path), "parts": ["f.txt"], "max": 10}, data_limit=10
    )
    assert read.t == "file" and data == b"abcd"


@pytest.mark.slow
async def test_a_stopped_agent_ends_the_link_and_the_registry_replaces_and_kills_it(
    agents: LocalAgents, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(agent_link, "ANSWER_TIMEOUT_S", 1.0)
    registry = ResidentAgents(agents)
    spec = a_spec(tmp_path)
    first = await registry.link("container-id", spec, None)
    assert first is not None and (await first.run(["true"])).exit_code == 0
    os.kill(first.agent_pid, signal.SIGSTOP)
    with pytest.raises(AgentUnavailable, match="did not answer"):
        await first.ping()
    second = await registry.link("container-id", spec, None)
    assert second is not None and second is not first and second.agent_pid != first.agent_pid
    assert agents.killed == [first.agent_pid] and registry.started == 2
    assert (await second.run(["sh", "-c", "echo again"])).stdout == b"again\n"


async def test_an_agent_that_exits_is_found_dead_before_a_request_is_sent(agents: LocalAgents, tmp_path: Path) -> None:
    registry = ResidentAgents(agents)
    spec = a_spec(tmp_path)
    first = await registry.link("container-id", spec, None)
    assert first is not None
    os.kill(first.agent_pid, signal.SIGKILL)
    with anyio.fail_after(10):
        while first.check():
            await anyio.sleep(0.02)
    assert "ended" in (first.dead or "")
    second = await registry.link("container-id", spec, None)
    assert second is not None and second.dead is None and registry.started == 2


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("w(frame({'t': 'pong', 'id': 99}))\nsys.stdin.buffer.read()\n", "never made"),
        ("w(struct.pack('>II', 10, 1 << 30))\nsys.stdin.buffer.read()\n", "over the limits"),
        ("w(frame({'t': 'exit', 'id': 1, 'code': 0, 'signal': 0}))\nsys.stdin.buffer.read()\n", "before it started"),
        (
            "w(frame({'t': 'hello', 'id': 0, 'protocol': 1, 'pid': 1, 'pidfd': False}))\nsys.stdin.buffer.read()\n",
            "twice",
        ),
        ("sys.stderr.write('Traceback: boom')\nsys.stderr.flush()\n", "it said: Traceback: boom"),
    ],
)
@pytest.mark.slow
async def test_a_hostile_or_broken_agent_ends_only_its_link(tmp_path: Path, body: str, words: str) -> None:
    agents = LocalAgents()
    try:
        link = await AgentLink.open(agents, "container-id", hostile(tmp_path, body), None)
        with pytest.raises(AgentUnavailable):
            await link.ping()
        assert link.dead is not None and words in link.dead, link.dead
        with pytest.raises(AgentUnavailable, match="gone"):
            await link.run(["true"])
    finally:
        agents.reap()


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_an_agent_that_never_greets_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_link, "HELLO_TIMEOUT_S", 0.5)
    script = tmp_path / "mute.py"
    script.write_text("import sys\nsys.stdin.buffer.read()\n")
    agents = LocalAgents()
    try:
        with pytest.raises(AgentUnavailable, match="did not greet"):
            await AgentLink.open(agents, "container-id", str(script), None)
    finally:
        agents.reap()
    assert sys.executable  # the host's python stood in for the sandbox's


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_the_signal_frame_reaches_the_process_group_of_a_tagged_command(link: AgentLink, tmp_path: Path) -> None:
    """A command run with a tag and outliving its wait is killed by the signal frame alone (the
    first step of a kill on a cluster); an unknown tag sends nothing."""
    pid_file = tmp_path / "pid"
    slow = await link.run(["/bin/sh", "-c", f"echo $$ > {pid_file}; sleep 300"], timeout_s=0.5, tag="call-1")
    assert slow.timed_out
    pid = int(pid_file.read_text())
    assert await link.signal_tagged("unknown", signal.SIGKILL) is False
    assert await link.signal_tagged("call-1", signal.SIGKILL) is True
    with anyio.fail_after(10):
        while True:
            try:
                os.kill(pid, 0)
                # reaped between the two looks: its /proc entry is gone too (ProcessLookupError)
                if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                    break  # dead, not yet reaped by the agent
            except (ProcessLookupError, FileNotFoundError):  # gone (the /proc entry too, between the looks)
                break
            await anyio.sleep(0.05)


class FailingFor(LocalAgents):
    """LocalAgents whose agents cannot start for the users in `failing` (a fault, as when another
    session filled the sandbox's pids limit just then)."""

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__(labels)
        self.failing: set[str] = set()
        self.attempts: list[str | None] = []

    async def start(self, container_id: str, argv: list[str], user: str | None) -> Any:
        self.attempts.append(user)
        if user in self.failing:
            raise AgentUnavailable("fork: Resource temporarily unavailable")
        return await super().start(container_id, argv, user)


async def test_one_user_s_failed_start_keeps_only_that_user_on_docker_exec_and_only_for_a_while(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A session whose agent could not start (another session filled the pids limit at that
    moment) uses docker exec; the other sessions of the container keep their agents, and its own
    is tried again after 30 s, then after twice as long each time it fails again."""
    clock = [1000.0]
    monkeypatch.setattr(resident, "clock", lambda: clock[0])
    agents = FailingFor(LABELS)
    registry = ResidentAgents(agents)
    spec = a_spec(tmp_path)
    try:
        agents.failing = {"2001"}
        assert await registry.link("box", spec, "2001") is None
        path = await registry.exec_path(spec, "box", "2001")
        assert path.kind == "docker exec" and "user 2001" in path.reason and "Resource temporarily" in path.reason
        other = await registry.link("box", spec, "2002")  # another session of the same container
        assert other is not None and (await other.run(["true"])).exit_code == 0
        assert (await registry.exec_path(spec, "box", "2002")).kind == "agent"
        assert await registry.link("box", spec, "2001") is None and agents.attempts.count("2001") == 1
        clock[0] += 31  # tried again: still failing, now for 60 s
        assert await registry.link("box", spec, "2001") is None and agents.attempts.count("2001") == 2
        clock[0] += 45
        assert await registry.link("box", spec, "2001") is None and agents.attempts.count("2001") == 2
        agents.failing.clear()  # the pids are free again
        clock[0] += 16
        again = await registry.link("box", spec, "2001")
        assert again is not None and (await again.run(["true"])).exit_code == 0
        assert (await registry.exec_path(spec, "box", "2001")).kind == "agent"
        assert agents.attempts.count("2001") == 3
    finally:
        agents.reap()


def test_the_wait_between_tries_doubles_up_to_half_an_hour() -> None:
    waits = [resident.RETRY_FIRST_S]
    while waits[-1] < resident.RETRY_MAX_S:
        waits.append(min(waits[-1] * 2, resident.RETRY_MAX_S))
    assert waits[:3] == [30.0, 60.0, 120.0] and waits[-1] == 1800.0


async def test_links_whose_agents_ended_while_idle_are_dropped_with_their_descriptors(
    agents: LocalAgents, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A container removed by another process (a CLI prune, a replica) is never asked for again
    here: its idle link must not hold a socket and pipes until the service runs out of them."""
    clock = [1000.0]
    monkeypatch.setattr(resident, "clock", lambda: clock[0])
    registry = ResidentAgents(agents)
    spec = a_spec(tmp_path)
    fds_before = len(os.listdir("/proc/self/fd"))
    links = [await registry.link(f"container-{i}", spec, None) for i in range(3)]
    assert all(link is not None for link in links)
    for link in links[:2]:
        assert link is not None
        os.kill(link.agent_pid, signal.SIGKILL)  # its container went, elsewhere
    for transport in agents.started[:2]:
        transport.proc.wait(timeout=10)
    await registry.link("container-2", spec, None)  # within the period: nothing looked at
    assert len(registry._links) == 3
    clock[0] += resident.SWEEP_EVERY_S
    kept = await registry.link("container-2", spec, None)
    assert kept is links[2] and set(registry._links) == {("container-2", spec.user)}
    assert set(registry._locks) <= {("container-2", spec.user)}
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 4  # the live link's own, no more
    registry.close_all()


async def test_a_link_that_died_in_a_call_is_dropped_after_a_period_without_calls(
    agents: LocalAgents, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(resident, "clock", lambda: clock[0])
    registry = ResidentAgents(agents)
    spec = a_spec(tmp_path)
    link = await registry.link("container-gone", spec, None)
    assert link is not None
    link.close("died in a call")  # as a failed call marks it
    clock[0] += resident.SWEEP_EVERY_S
    await registry.link("container-other", spec, None)
    assert ("container-gone", spec.user) in registry._links  # a call of its own may still replace it
    clock[0] += resident.SWEEP_EVERY_S
    await registry.link("container-other", spec, None)
    assert ("container-gone", spec.user) not in registry._links
    registry.close_all()


async def test_the_agent_removes_a_finished_command_s_pid_file_unless_its_group_lives_on(
    link: AgentLink, tmp_path: Path
) -> None:
    done, lingering = tmp_path / "done.pid", tmp_path / "lingering.pid"
    result = await link.run(["sh", "-c", f"echo $$ > {done}; exit 3"], pid_file=str(done))
    assert result.exit_code == 3
    with anyio.fail_after(5):  # removed just after the answer, off the call's path
        while done.exists():
            await anyio.sleep(0.01)
    result = await link.run(["sh", "-c", f"echo $$ > {lingering}; sleep 5 >/dev/null 2>&1 &"], pid_file=str(lingering))
    assert result.exit_code == 0 and lingering.exists()  # a kill of the call still needs its group
    os.killpg(int(lingering.read_text()), signal.SIGKILL)
    with pytest.raises(AgentUnavailable, match="absolute path"):
        await link.run(["true"], pid_file="relative.pid")
