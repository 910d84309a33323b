"""The agent link over a `pods/exec` websocket (runtime/kubernetes/exec_ws.py), against a server
that speaks the API server's subprotocols (tests/k8s_exec_server.py) bridged to the real agent
program: what a cluster's exec stream does, and what a broken or hostile one does, without a cluster."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anyio
import pytest

from sandbox.runtime.agent.link import AgentLink, AgentUnavailable
from sandbox.runtime.kubernetes.agents import PodExecStarter, keep_alive
from sandbox.runtime.kubernetes.exec_ws import V4, V5, ExecRefused, closed_streams, exec_url, exit_code_of, open_exec
from tests.k8s_exec_server import ExecServer, Faults

pytestmark = pytest.mark.anyio

AGENT = str(Path(__file__).resolve().parents[1] / "images/sandbox/sandbox_agent.py")
AUTH = {"Authorization": "Bearer good-token"}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
        await closed_streams()  # the closing handshakes a test's close() started


async def _link(server: ExecServer, http: aiohttp.ClientSession, **headers: str) -> AgentLink:
    starter = PodExecStarter(http, server.url, "sbx-acme", headers=headers or AUTH, heartbeat_s=5)
    return await AgentLink.open(starter, "sbx-pod-1", AGENT, None)


async def _wait_until(predicate: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        await anyio.sleep(0.05)


async def test_v5_is_agreed_and_closing_stdin_ends_the_command_with_its_exit_code(
    http: aiohttp.ClientSession,
) -> None:
    async with ExecServer() as server:
        url = exec_url(server.url, "ns", "pod", ["sh", "-c", "cat; exit 3"])
        transport = await open_exec(http, url, headers=AUTH)
        assert transport.protocol == V5
        await transport.send(b"hello over channel 0")
        assert await transport.close_stdin() is True  # [255, 0]: stdin ends, output still comes
        received = b""
        while chunk := await transport.receive(65536):
            received += chunk
        assert received == b"hello over channel 0"
        assert transport.exit_code == 3 and transport.ended()
        assert server.execs[0]["query"][:3] == [("command", "sh"), ("command", "-c"), ("command", "cat; exit 3")]
        transport.close()


async def test_v4_only_works_and_closing_the_socket_ends_the_command(http: aiohttp.ClientSession) -> None:
    async with ExecServer(protocols=(V4,)) as server:
        transport = await open_exec(http, exec_url(server.url, "ns", "pod", ["cat"]), headers=AUTH)
        assert transport.protocol == V4
        await transport.send(b"ping")
        assert await transport.receive(100) == b"ping"
        assert await transport.close_stdin() is False  # v4 has no CLOSE signal
        transport.close()
        await _wait_until(lambda: not server.alive())
        assert server.alive() == []  # the socket's end closed its stdin: nothing left running


async def test_an_exec_the_role_does_not_allow_is_a_clear_refusal(http: aiohttp.ClientSession) -> None:
    async with ExecServer() as server:
        with pytest.raises(ExecRefused) as refused:
            await open_exec(http, exec_url(server.url, "ns", "pod", ["true"]), headers={"Authorization": "Bearer x"})
        assert refused.value.status == 403
        assert "`get` and `create` on `pods/exec`" in refused.value.message
        assert server.alive() == [] and len(server.execs) == 1  # nothing ran


@pytest.mark.slow
async def test_the_real_agent_answers_over_the_websocket(http: aiohttp.ClientSession) -> None:
    async with ExecServer() as server:
        link = await _link(server, http)
        try:
            result = await link.run(["sh", "-c", "echo out; echo err >&2; exit 7"], environment={"X": "1"})
            assert result.exit_code == 7 and b"out" in result.stdout
            words = {}

            async def one(word: str, delay: float) -> None:
                words[word] = (await link.run(["sh", "-c", f"sleep {delay}; echo {word}"])).stdout

            async with anyio.create_task_group() as group:  # multiplexed on one stream
                group.start_soon(one, "slow", 0.4)
                group.start_soon(one, "fast", 0.0)
            assert words == {"slow": b"slow\n", "fast": b"fast\n"}
            assert await link.ping() >= 0
        finally:
            link.close()
        await _wait_until(lambda: not server.alive())
        assert server.alive() == []  # the link's end ends the agent


async def test_a_stream_cut_mid_frame_kills_the_link_not_the_caller(http: aiohttp.ClientSession) -> None:
    async with ExecServer(faults=Faults(cut_after_bytes=40)) as server:
        with pytest.raises(AgentUnavailable):
            link = await _link(server, http)
            try:
                await link.run(["sh", "-c", "head -c 5000 /dev/zero"])
            finally:
                link.close()


@pytest.mark.slow
async def test_an_idle_stream_is_cut_unless_the_agent_is_pinged(http: aiohttp.ClientSession) -> None:
    async with ExecServer(faults=Faults(idle_cut_s=1.5)) as server:
        quiet = await _link(server, http)
        await anyio.sleep(3.5)
        with pytest.raises(AgentUnavailable):  # the server cut the idle stream: the next use finds it dead
            await quiet.run(["echo", "x"])
        assert quiet.dead is not None
        quiet.close()
        kept = await _link(server, http)
        async with anyio.create_task_group() as group:
            group.start_soon(keep_alive, kept, 0.2)
            await anyio.sleep(3.5)
            assert kept.dead is None
            assert (await kept.run(["echo", "still here"])).stdout == b"still here\n"
            group.cancel_scope.cancel()
        kept.close()


async def test_garbage_on_an_unknown_channel_ends_the_link(http: aiohttp.ClientSession) -> None:
    async with ExecServer(faults=Faults(garbage=True)) as server:
        with pytest.raises(AgentUnavailable):
            link = await _link(server, http)
            try:
                await link.run(["echo", "x"])
            finally:
                link.close()


async def test_a_one_gigabyte_message_is_refused_at_its_header(http: aiohttp.ClientSession) -> None:
    async with ExecServer(faults=Faults(huge=True)) as server:
        transport = await open_exec(http, exec_url(server.url, "ns", "pod", ["sleep", "30"]), headers=AUTH)
        with anyio.fail_after(10):
            try:
                got = await transport.receive(100)
            except ValueError as exc:  # the reader's refusal, as aiohttp reports it
                assert re.search(r"exceeds limit|too big|MESSAGE_TOO_BIG", str(exc)), exc
            else:  # or the stream already closed for it: nothing was read either way
                assert got == b""
        assert transport.ended()
        transport.close()


async def test_exec_cannot_choose_a_user(http: aiohttp.ClientSession) -> None:
    async with ExecServer() as server:
        starter = PodExecStarter(http, server.url, "ns", headers=AUTH)
        with pytest.raises(AgentUnavailable, match="own uid gets a Pod of its own"):
            await AgentLink.open(starter, "pod", AGENT, "24107:1000")
        assert server.execs == []


def test_the_status_channel_is_read_like_client_go() -> None:
    assert exit_code_of({"status": "Success"}) == 0
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "42"}]},
    }
    assert exit_code_of(failure) == 42
    assert exit_code_of({"status": "Failure", "reason": "InternalError", "message": "boom"}) is None
    hostile = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "999"}]},
    }
    assert exit_code_of(hostile) is None
    assert exit_code_of({"status": "Failure", "reason": "NonZeroExitCode", "details": {"causes": "x"}}) is None
    assert exit_code_of({"status": "Failure", "reason": "NonZeroExitCode", "details": "x"}) is None
    for odd in ("4_2", "٤٢", " 42", "-1", 42):
        cause = {"reason": "ExitCode", "message": odd}
        assert exit_code_of({"status": "Failure", "reason": "NonZeroExitCode", "details": {"causes": [cause]}}) is None


async def test_a_server_that_agrees_no_subprotocol_is_refused(http: aiohttp.ClientSession) -> None:
    async with ExecServer(protocols=("channel.k8s.io",)) as server:
        with pytest.raises(ExecRefused, match="agreed to no subprotocol"):
            await open_exec(http, exec_url(server.url, "ns", "pod", ["true"]), headers=AUTH)
