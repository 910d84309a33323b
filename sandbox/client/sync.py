"""Client: the service's routes as typed methods (httpx.Client underneath; AsyncClient in aio.py is the same, async)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

import httpx
from tenacity import Retrying

from sandbox.client import wire
from sandbox.client.errors import ServiceError, error_for, transport_error
from sandbox.client.models import (
    APPROVAL,
    APPROVALS,
    EVENTS,
    Agent,
    BatchMode,
    CallState,
    Explain,
    Format,
    LogPage,
    PreviewLink,
    SandboxInfo,
    SessionEvent,
)
from sandbox.client.wire import RetryPolicy
from sandbox.engine.batch import BatchCall, BatchResult
from sandbox.errors import ErrorCode
from sandbox.journal.approvals import Approval
from sandbox.journal.queries import Event
from sandbox.tools.spec import ToolResult


class Client:
    """A tenant's view of `sandbox serve`.

    Args:
        base_url: the service, e.g. `http://127.0.0.1:8710`.
        token: the tenant's bearer token (`sandbox tenants token create`).
        timeout: httpx's timeout; by default 10 s to connect and no read limit (a call lasts as
            long as its tool, or its approval).
        retry: how a 429 is retried (Retry-After honoured, bounded attempts).
        transport: an httpx transport (tests, proxies); the default connects over TCP.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: httpx.Timeout | float | None = wire.DEFAULT_TIMEOUT,
        retry: RetryPolicy = wire.DEFAULT_RETRY,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retry = retry
        self._http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """The service's address, without a trailing slash."""
        return str(self._http.base_url).rstrip("/")

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def request(self, method: str, url: str, **options: Any) -> httpx.Response:
        """One request, retried on 429 as `retry` says.

        Raises:
            ServiceError: the service refused it (AuthenticationError, NotFoundError, RateLimitedError...).
            ServiceTransportError: no complete answer arrived.
        """
        for attempt in Retrying(**self.retry.tenacity()):
            with attempt:
                try:
                    response = self._http.request(method, url, **options)
                except httpx.TransportError as exc:
                    raise transport_error(exc) from exc
                return wire.checked(response)
        raise AssertionError("tenacity ends with a return or an exception")  # pragma: no cover

    def session(self, key: str, *, agent: str | None = None) -> ClientSession:
        """The session `key` (nothing is sent until it is used)."""
        return ClientSession(self, key, agent)

    def call_handle(self, call_id: str) -> CallHandle:
        """The handle of a call by its id (a submitted one's, or one this client learnt of)."""
        return CallHandle(self, call_id)

    def agents(self) -> list[Agent]:
        """The tenant's agents."""
        return [Agent.model_validate(a) for a in (self.request("GET", "/v1/agents")).json()]

    def tools(self, session: str, *, agent: str | None = None, format: Format = "openai") -> list[dict[str, Any]]:
        """What the model of `session` is offered, in `format`'s own JSON (openai, anthropic, mcp)."""
        query = wire.params(session=session, agent=agent, format=format)
        found: list[dict[str, Any]] = (self.request("GET", "/v1/tools", params=query)).json()
        return found

    def explain(self, session: str, *, agent: str | None = None) -> Explain:
        """The policy decision per tool, with layers and config keys."""
        answer = self.request("GET", "/v1/explain", params=wire.params(session=session, agent=agent))
        return Explain.model_validate_json(answer.content)

    def sandboxes(self) -> list[SandboxInfo]:
        """The tenant's live sandboxes."""
        return [SandboxInfo.model_validate(s) for s in (self.request("GET", "/v1/sandboxes")).json()]

    def approvals(self) -> list[Approval]:
        """The tenant's pending approvals, each with its exact arguments."""
        return APPROVALS.validate_json((self.request("GET", "/v1/approvals")).content)

    def approval(self, approval_id: str) -> Approval:
        """One pending approval (the service has no route of its own for one: it is found in the list).

        Raises:
            NotFoundError: not pending, not this tenant's, or no such approval.
        """
        for found in self.approvals():
            if found.id == approval_id:
                return found
        raise wire.not_pending(approval_id)

    def approve(self, approval_id: str) -> Approval:
        """Approve a pending call: it runs.

        Raises:
            NotFoundError: not a pending approval of this tenant.
            ServiceError: CONFLICT (409), decided already.
        """
        answer = self.request("POST", wire.path("/v1/approvals", approval_id, "approve"))
        return APPROVAL.validate_json(answer.content)

    def deny(self, approval_id: str) -> Approval:
        """Deny a pending call: it returns APPROVAL_DENIED. Raises like :meth:`approve`."""
        answer = self.request("POST", wire.path("/v1/approvals", approval_id, "deny"))
        return APPROVAL.validate_json(answer.content)

    def logs(
        self,
        *,
        session: str | None = None,
        trace: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> LogPage:
        """One page of the tenant's journal events, newest first; pass `next_cursor` on for the next."""
        query = wire.params(session=session, trace=trace, since=since, until=until, limit=limit, cursor=cursor)
        answer = self.request("GET", "/v1/logs", params=query)
        return LogPage(events=EVENTS.validate_json(answer.content), next_cursor=answer.headers.get(wire.NEXT_CURSOR))

    def iter_logs(
        self,
        *,
        session: str | None = None,
        trace: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
    ) -> Iterator[Event]:
        """Every matching event, newest first, fetched a page (`limit`) at a time."""
        cursor: str | None = None
        while True:
            page = self.logs(session=session, trace=trace, since=since, until=until, limit=limit, cursor=cursor)
            yield from page.events
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def stream(self, method: str, url: str, **options: Any) -> AbstractContextManager[httpx.Response]:
        """httpx's streaming request, its refusals unmapped and unretried (the event stream maps them)."""
        return self._http.stream(method, url, **options)


class ClientSession:
    """One session through the service; the same calls as the library's Session (see ToolSession)."""

    def __init__(self, client: Client, key: str, agent: str | None) -> None:
        self._client = client
        self._key = key
        self._agent = agent

    @property
    def key(self) -> str:
        """The session key."""
        return self._key

    def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        approved: str | None = None,
    ) -> ToolResult:
        """Run one tool call; a tool's failure is the ToolResult's `error`, not an exception.
        With `idempotency_key` it runs once for the key (a repeat, after a lost answer, gets the
        first call's result).

        Raises:
            ServiceError: the service refused the request (auth, tenancy, quota, stopping; the
                key used for another call: INVALID_ARGUMENTS).
        """
        body = wire.call_body(name, arguments, self._agent, approved)
        path = wire.session_path(self._key, "calls")
        response = self._client.request("POST", path, json=body, headers=wire.key_headers(idempotency_key))
        return wire.tool_result(response)

    def submit(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, idempotency_key: str | None = None
    ) -> CallHandle:
        """Start one call and return its handle at once (see AsyncClientSession.submit)."""
        body = wire.call_body(name, arguments, self._agent)
        path = wire.session_path(self._key, "calls")
        response = self._client.request("POST", path, json=body, headers=wire.submit_headers(idempotency_key))
        return CallHandle(self._client, wire.submitted_id(response))

    def call_many(self, calls: Iterable[BatchCall], *, mode: BatchMode = "parallel") -> BatchResult:
        """Run a batch (1-64 calls) as the engine does; the library's BatchResult."""
        body = wire.batch_body(calls, mode, self._agent)
        return wire.batch_result(self._client.request("POST", wire.session_path(self._key, "batches"), json=body))

    def approval_required(self, name: str, arguments: Mapping[str, Any] | None = None) -> bool:
        """Whether this call would wait for a human (`tools.approvals`); with `call(...,
        approved=REASON)` an agent framework pauses for its own approval first (docs/adapters.md)."""
        body = wire.call_body(name, arguments, self._agent)
        answer = self._client.request("POST", wire.session_path(self._key, "approval-check"), json=body)
        return bool(answer.json()["required"])

    def tools(self, format: Format = "openai") -> list[dict[str, Any]]:
        """What this session's model is offered, in `format`."""
        return self._client.tools(self._key, agent=self._agent, format=format)

    def explain(self) -> Explain:
        """The policy decision per tool for this session."""
        return self._client.explain(self._key, agent=self._agent)

    def preview_link(self, port: int, *, ttl_s: int | None = None) -> PreviewLink:
        """A signed link to `port` of the session's running sandbox, for a browser (docs/preview.md):
        it works for `ttl_s` seconds (at most, and by default, the agent's
        `sandbox.preview.link_ttl_s`), and ends sooner when the session closes.

        Raises:
            ServiceError: the port is not in `sandbox.preview.ports` (403), the session has no
                running sandbox (404), `ttl_s` is too long (400).
        """
        body = {"port": port, **({"ttl_s": ttl_s} if ttl_s is not None else {})}
        path = wire.session_path(self._key, "preview-links")
        answer = self._client.request("POST", path, json=body, params=wire.params(agent=self._agent))
        link = PreviewLink.model_validate_json(answer.content)
        return link.model_copy(update={"url": self._client.base_url + link.url})

    def events(self) -> EventStream:
        """The session's progress events: `with session.events() as events: for e in events`.
        Connected on entry, so calls made inside the block are seen from their first event."""
        query = wire.params(agent=self._agent)
        return EventStream(self._client, wire.session_path(self._key, "events"), query)

    def close(self) -> list[str]:
        """Close the session and its descendants; the keys closed."""
        answer = self._client.request("DELETE", wire.session_path(self._key), params=wire.params(agent=self._agent))
        closed: list[str] = answer.json()["closed"]
        return closed


class CallHandle:
    """A call running in the service, by its id (see AsyncCallHandle)."""

    def __init__(self, client: Client, call_id: str) -> None:
        self._client = client
        self.call_id = call_id

    def status(self, wait_s: float = 0.0) -> CallState:
        """Its state (once it ended, when that comes within `wait_s`, at most 60 s per request)."""
        query = wire.params(wait=min(max(wait_s, 0.0), wire.MAX_WAIT_S) or None)
        return wire.call_state(self._client.request("GET", f"/v1/calls/{self.call_id}", params=query))

    def result(self, timeout_s: float | None = None) -> ToolResult:
        """Its ToolResult once it ended (an abandoned call's: CONFLICT with the reason).

        Raises:
            TimeoutError: it had not ended within `timeout_s`.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = wire.MAX_WAIT_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"call {self.call_id} had not ended within {timeout_s:g} s")
            ended = wire.ended_result(self.status(wait_s=min(left, wire.MAX_WAIT_S)))
            if ended is not None:
                return ended

    def cancel(self) -> bool:
        """Stop it; False when it had ended already (see AsyncCallHandle.cancel)."""
        try:
            self._client.request("DELETE", f"/v1/calls/{self.call_id}")
        except ServiceError as exc:
            if exc.code is ErrorCode.CONFLICT and self.status().state in ("finished", "abandoned"):
                return False
            raise
        return True


class EventStream:
    """A session's server-sent events as an iterator of SessionEvent.

    Raises (on entry or while iterating):
        ServiceError: the stream was refused (404, 429 past service.max_event_streams_per_tenant).
        ServiceTransportError: the connection closed before the service ended the stream.
    """

    def __init__(self, client: Client, url: str, query: dict[str, Any]) -> None:
        self._client, self._url, self._query = client, url, query
        self._context: AbstractContextManager[httpx.Response] | None = None
        self._response: httpx.Response | None = None

    def __enter__(self) -> EventStream:
        self._context = self._client.stream("GET", self._url, params=self._query)
        try:
            response: httpx.Response = self._context.__enter__()
        except httpx.TransportError as exc:
            raise transport_error(exc) from exc
        if not response.is_success:
            body = response.read()
            self._context.__exit__(None, None, None)
            raise error_for(response, body)
        self._response = response
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._context is not None:
            self._context.__exit__(kind, exc, tb)

    def __iter__(self) -> Iterator[SessionEvent]:
        if self._response is None:
            raise RuntimeError("use the stream inside `with session.events() as events`")
        parser = wire.SSEParser()
        try:
            for line in self._response.iter_lines():
                if (event := parser.feed(line)) is not None:
                    yield event
        except httpx.TransportError as exc:
            raise transport_error(exc) from exc
