"""sandbox.client against a live `sandbox serve` process on loopback (agents with sandboxing off;
test_client_docker.py makes one sandboxed call): every route family, typed answers, refusals as
typed exceptions with the library's codes, and the same session code run against the library and
the service."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sandbox import ErrorCode, Orchestrator
from sandbox.client import (
    AsyncClient,
    AuthenticationError,
    BatchCall,
    Client,
    NotFoundError,
    RateLimitedError,
    RetryPolicy,
    ServiceError,
    ToolResult,
    ToolSession,
)
from sandbox.config import load_config_text
from tests.client_helpers import TOKEN_L, client_service, service_yaml
from tests.service_helpers import TOKEN_A, TOKEN_B

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One service process for the module."""
    with client_service(tmp_path_factory.mktemp("client")) as found:
        yield found


class Counting(httpx.HTTPTransport):
    """A real transport that counts the requests it sends (to see tenacity's retries)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return super().handle_request(request)


def test_reads_are_typed(url: str) -> None:
    """agents, tools in each vendor format, explain and sandboxes come back as typed answers."""
    with Client(url, TOKEN_A) as client:
        assert [(a.id, a.tenant, a.sandbox.mode) for a in client.agents()] == [("alpha", "acme", "off")]
        session = client.session("agent:alpha:reads")
        openai = session.tools("openai")
        anthropic = session.tools("anthropic")
        mcp = session.tools("mcp")
        assert {t["function"]["name"] for t in openai} == {t["name"] for t in anthropic} == {t["name"] for t in mcp}
        assert "input_schema" in anthropic[0] and "inputSchema" in mcp[0]
        explain = session.explain()
        assert explain.agent == "alpha" and explain.session == "agent:alpha:reads" and not explain.sandboxed
        allowed = {t.name for t in explain.tools if t.allowed}
        assert {t["name"] for t in anthropic} <= allowed  # offered: allowed and registered
        assert client.sandboxes() == []  # sandboxing is off: nothing was made


def test_a_tool_failure_is_a_result_and_a_batch_is_the_librarys(url: str) -> None:
    """A read of a missing file is a ToolResult with FILE_NOT_FOUND (no exception); a batch is a BatchResult."""
    with Client(url, TOKEN_A) as client:
        session = client.session("agent:alpha:results")
        missing = session.call("read", {"path": "nope.txt"})
        assert isinstance(missing, ToolResult) and not missing.ok
        assert missing.error is not None and missing.error.code == "FILE_NOT_FOUND" and not missing.error.retryable
        ran = session.call("exec", {"command": "echo hello"})
        assert ran.ok and "hello" in ran.output["output"]
        batch = session.call_many(
            [BatchCall("exec", {"command": "echo one"}, id="a"), BatchCall("read", {"path": "gone"}, id="b")],
            mode="sequential",
        )
        assert batch.status == "PARTIAL_SUCCESS" and batch.failed == ["b"]
        assert [r.ok for r in batch.results] == [True, False]
        assert session.close() == ["agent:alpha:results"]


def test_a_wrong_token_is_an_authentication_error(url: str) -> None:
    """A token the service does not know: AuthenticationError, 401, PERMISSION_DENIED, not retryable."""
    with Client(url, "sbx_not-a-token") as client, pytest.raises(AuthenticationError) as raised:
        client.agents()
    err = raised.value
    assert (err.status, err.code, err.retryable, err.http_status) == (401, ErrorCode.PERMISSION_DENIED, False, 401)


def test_another_tenants_session_is_not_found(url: str) -> None:
    """globex's token on acme's agent: NotFoundError (404), for a call, a close, events and explain."""
    with Client(url, TOKEN_B) as client:
        theirs = client.session("agent:alpha:private")
        for attempt in (
            lambda: theirs.call("exec", {"command": "id"}),
            theirs.close,
            theirs.explain,
            lambda: theirs.events().__enter__(),
        ):
            with pytest.raises(NotFoundError) as raised:
                attempt()
            assert raised.value.status == 404 and not raised.value.retryable


def test_a_tight_quota_is_retried_after_retry_after_then_raised(url: str) -> None:
    """Past max_calls_per_minute the 429's Retry-After is read; tenacity tries `attempts` times, then
    RateLimitedError (RATE_LIMITED, retryable) carries the wait the service asked for."""
    counting = Counting()
    policy = RetryPolicy(attempts=3, max_wait_s=0.05)  # the service asks for up to a minute: not in a test
    with Client(url, TOKEN_L, retry=policy, transport=counting) as client:
        session = client.session("agent:delta:q")
        assert session.call("exec", {"command": "true"}).ok
        assert session.call("exec", {"command": "true"}).ok
        assert counting.sent == 2
        with pytest.raises(RateLimitedError) as raised:
            session.call("exec", {"command": "true"})
    err = raised.value
    assert counting.sent == 2 + 3  # the refused call, tried three times in all
    assert (err.status, err.code, err.retryable) == (429, ErrorCode.RATE_LIMITED, True)
    assert err.retry_after_s is not None and err.retry_after_s > 0
    assert "max_calls_per_minute" in err.message


@pytest.mark.anyio
async def test_events_stream_a_calls_progress(url: str) -> None:
    """The async event stream, open before a call, yields that call's events up to `finished`."""
    async with AsyncClient(url, TOKEN_A) as client:
        session = client.session("agent:alpha:events")
        async with session.events() as events:
            result = await session.call("exec", {"command": "echo streamed"})
            kinds = []
            with anyio.fail_after(30):
                async for event in events:
                    if event.call_id == result.call_id:
                        kinds.append(event.kind)
                        if event.kind == "finished":
                            break
        assert result.ok and kinds[0] == "queued" and kinds[-1] == "finished", kinds
        await session.close()


@pytest.mark.anyio
async def test_approvals_listed_shown_approved_and_denied(url: str) -> None:
    """A write waits for a human: listed with its exact arguments, shown, approved (it runs) or
    denied (APPROVAL_DENIED as a result); another tenant cannot see or decide it."""
    async with AsyncClient(url, TOKEN_A) as client, AsyncClient(url, TOKEN_B) as stranger:
        session = client.session("agent:alpha:approvals")
        outcomes: dict[str, ToolResult] = {}

        async def write(name: str) -> None:
            outcomes[name] = await session.call("write", {"path": name, "content": "x\x1b[31m"})

        for name, verdict in (("a.txt", "approve"), ("d.txt", "deny")):
            async with anyio.create_task_group() as tg:
                tg.start_soon(write, name)
                with anyio.fail_after(30):
                    while not (pending := await client.approvals()):
                        await anyio.sleep(0.05)
                [approval] = pending
                assert approval.tool == "write" and approval.arguments == {"path": name, "content": "x\x1b[31m"}
                assert (await client.approval(approval.id)).id == approval.id
                assert await stranger.approvals() == []
                with pytest.raises(NotFoundError):
                    await stranger.approve(approval.id)
                decided = await (client.approve(approval.id) if verdict == "approve" else client.deny(approval.id))
                assert decided.status == ("approved" if verdict == "approve" else "denied")
        assert outcomes["a.txt"].ok
        denied = outcomes["d.txt"]
        assert denied.error is not None and denied.error.code == "APPROVAL_DENIED"
        with pytest.raises(NotFoundError):
            await client.approval("no-such-approval")
        await session.close()


def test_logs_page_with_cursors(url: str) -> None:
    """Pages of one event follow X-Next-Cursor back to the start; iter_logs walks the same events."""
    with Client(url, TOKEN_A) as client:
        session = client.session("agent:alpha:logs")
        for _ in range(2):
            assert session.call("exec", {"command": "true"}).ok
        pages, cursor = [], None
        while True:
            page = client.logs(session="agent:alpha:logs", limit=1, cursor=cursor)
            pages.append(page.events)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        flat = [e for events in pages for e in events]
        assert all(len(events) <= 1 for events in pages) and len(flat) >= 4  # two calls, several stages each
        assert all(e.tenant == "acme" and e.session == "agent:alpha:logs" for e in flat)
        assert [e.id for e in client.iter_logs(session="agent:alpha:logs", limit=3)] == [e.id for e in flat]
        assert client.logs(session="agent:alpha:logs", limit=1000).next_cursor is None
    with Client(url, TOKEN_B) as stranger:
        assert stranger.logs(session="agent:alpha:logs").events == []


async def exercise(session: ToolSession) -> list[Any]:
    """Agent code written once against ToolSession: it cannot tell the library from the service."""
    wrote = await session.call("exec", {"command": "printf same > same.txt"})
    read = await session.call("read", {"path": "same.txt"})
    missing = await session.call("read", {"path": "absent.txt"})
    batch = await session.call_many(
        [BatchCall("exec", {"command": "echo b1"}, id="1"), BatchCall("read", {"path": "same.txt"}, id="2")]
    )
    closed = await session.close()
    return [
        wrote.ok,
        read.output["content"],  # the workspace path differs: the library test has its own
        missing.error.code if missing.error else None,
        batch.status,
        [r.ok for r in batch.results],
        closed,
    ]


@pytest.mark.anyio
async def test_the_same_session_code_runs_on_the_library_and_the_service(url: str, tmp_path: Path) -> None:
    """One function over ToolSession gives the same answers in-process and through the service."""
    for folder in ("wa", "wb", "wd"):
        (tmp_path / folder).mkdir()
    config = load_config_text(service_yaml(tmp_path, state="library-state"))
    async with Orchestrator(config) as orch:
        local = await exercise(orch.session("agent:alpha:same", agent="alpha"))
    async with AsyncClient(url, TOKEN_A) as client:
        remote = await exercise(client.session("agent:alpha:same"))
    assert local == remote
    assert local[0] is True and local[2] == "FILE_NOT_FOUND" and local[3] == "SUCCESS"


def test_a_service_that_is_not_there_is_a_transport_error(tmp_path: Path) -> None:
    """Nothing listens: ServiceTransportError, NETWORK_ERROR, retryable, no status."""
    from sandbox.client import ServiceTransportError
    from tests.service_helpers import free_port

    with Client(f"http://127.0.0.1:{free_port()}", TOKEN_A) as client, pytest.raises(ServiceTransportError) as raised:
        client.agents()
    assert isinstance(raised.value, ServiceError)
    assert (raised.value.code, raised.value.retryable, raised.value.status) == (ErrorCode.NETWORK_ERROR, True, None)


def test_a_submitted_call_is_a_handle_in_both_clients(url: str) -> None:
    """`submit` answers at once with a handle; its result, its cancel (the command stopped, the
    record naming the tenant), a second cancel False; another tenant's id is not found."""
    with Client(url, TOKEN_A) as client, Client(url, TOKEN_B) as other:
        session = client.session("agent:alpha:h1")
        handle = session.submit("exec", {"command": "sleep 0.3; echo done"})
        assert handle.status().state in ("queued", "running", "finished")
        result = handle.result(timeout_s=30)
        assert result.ok and result.output["output"] == "done\n", result
        assert client.call_handle(handle.call_id).status().state == "finished"
        slow = session.submit("exec", {"command": "sleep 30"})
        assert slow.cancel() is True
        stopped = slow.result(timeout_s=30)
        assert (
            stopped.error is not None
            and stopped.error.code == "CONFLICT"
            and "cancelled by tenant acme" in (stopped.error.message)
        )
        assert slow.cancel() is False
        with pytest.raises(NotFoundError):
            other.call_handle(handle.call_id).status()

    async def through_the_async_client() -> None:
        async with AsyncClient(url, TOKEN_A) as client:
            handle = await client.session("agent:alpha:h2").submit(
                "exec", {"command": "echo once >> keyed.txt; echo ok"}, idempotency_key="client-k1"
            )
            again = await client.session("agent:alpha:h2").submit(
                "exec", {"command": "echo once >> keyed.txt; echo ok"}, idempotency_key="client-k1"
            )
            assert again.call_id == handle.call_id  # one call for the key
            result = await handle.result(timeout_s=30)
            assert result.ok and result.output["output"] == "ok\n"
            with pytest.raises(TimeoutError):
                await (await client.session("agent:alpha:h3").submit("exec", {"command": "sleep 5"})).result(
                    timeout_s=0.3
                )

    anyio.run(through_the_async_client)


@pytest.mark.anyio
async def test_an_adapter_over_the_client_pauses_in_its_framework_and_the_service_journals_it(url: str) -> None:
    """The PydanticAI adapter on an AsyncClientSession, approvals="framework": the service says
    which call would wait (POST .../approval-check, tenant-scoped), the framework pauses, and the
    call it then sends with `approved` runs without waiting, journaled approved by the caller."""
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from sandbox.adapters.pydantic_ai import pydantic_ai_tools

    async with AsyncClient(url, TOKEN_A) as client, AsyncClient(url, TOKEN_B) as stranger:
        session = client.session("agent:alpha:framework-approvals")
        assert await session.approval_required("write", {"path": "f.txt", "content": "x"})
        assert not await session.approval_required("read", {"path": "f.txt"})
        with pytest.raises(NotFoundError):  # another tenant's agent is not there at all
            await stranger.session("agent:alpha:framework-approvals").approval_required("write", {})
        steps: Iterator[list[Any]] = iter(
            [[ToolCallPart("write", {"path": "framework.txt", "content": "ok"}, tool_call_id="w1")], [TextPart("done")]]
        )

        def scripted(messages: list[Any], info: AgentInfo) -> ModelResponse:
            return ModelResponse(parts=next(steps))

        tools = await pydantic_ai_tools(session, approvals="framework")
        agent = Agent(FunctionModel(scripted), tools=tools, output_type=[str, DeferredToolRequests])
        first = await agent.run("write it")
        assert isinstance(first.output, DeferredToolRequests) and await client.approvals() == []
        second = await agent.run(
            message_history=first.all_messages(), deferred_tool_results=DeferredToolResults(approvals={"w1": True})
        )
        assert second.output == "done"
        read = await session.call("read", {"path": "framework.txt"})
        assert read.ok and read.output["content"] == "ok"
        events = (await client.logs(session="agent:alpha:framework-approvals")).events
        reasons = [str(e.data.get("reason", "")) for e in events if e.stage == "approved"]
        assert reasons and reasons[0].startswith("approved by the caller before the call: approved in PydanticAI")
        assert not [e for e in events if e.stage == "awaiting_approval"]
