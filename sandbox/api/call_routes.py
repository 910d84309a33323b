"""The service's call routes: a call, a batch, a session's event stream, and closing a session.

Calls and batches read their caller and body by hand (api/requests.py): the token is checked
before any of the body is read, and a tenant past its quota is refused before its body costs
anything. A call whose client goes away, or that outlives a stopping service's drain deadline,
is stopped and what it started is killed (api/serving.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sandbox.api.auth import CallerDep, current_caller
from sandbox.api.handle_routes import keyed_batch, submitted_call
from sandbox.api.limits import TenantLimits
from sandbox.api.metrics import Metrics
from sandbox.api.quotas import Admission
from sandbox.api.requests import BatchRequest, CallRequest, json_body, read_body
from sandbox.api.serving import StopWatch, past_drain_deadline
from sandbox.api.tenants import Caller
from sandbox.engine.batch import BatchCall, BatchResult, plan
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.errors import SandboxError

# the call route's optional header and the answers only a keyed call gives (docs/calls.md)
IDEMPOTENCY_DOC: dict[str, Any] = {
    "parameters": [
        {
            "name": "Prefer",
            "in": "header",
            "required": False,
            "description": "respond-async: answer 202 at once with Location /v1/calls/{call_id} (RFC 7240).",
            "schema": {"type": "string", "maxLength": 200},
        },
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": "Run the call once for this key (tenant-scoped, kept journal.idempotency_ttl); "
            "a repeat returns the first call's result.",
            "schema": {"type": "string", "pattern": "^[!-~]{1,200}$", "maxLength": 200},
        },
    ],
    "responses": {
        "202": {"description": "Prefer: respond-async: the call runs; Location is its handle."},
        "409": {"description": "The key's first call was abandoned (whether it ran is unknown)."},
        "499": {"description": "The client went away; a keyed call goes on."},
    },
}
SSE_KEEPALIVE_S = 15.0
SSE_STOP_POLL_S = 1.0  # how soon an event stream notices the service is stopping
T = TypeVar("T")


def add_call_routes(
    app: FastAPI,
    limits: TenantLimits,
    metrics: Metrics,
    admission: Admission,
    watch: StopWatch,
    session_for: Callable[[Request, Caller, str, str | None], Session],
) -> None:
    """Register the call, batch, event-stream and close routes on `app`."""

    def orch(request: Request) -> Orchestrator:
        found: Orchestrator = request.app.state.orch
        return found

    # the hot route: its body and caller are read by hand (see read_body), documented the same way
    @app.post("/v1/sessions/{key}/calls", openapi_extra={**json_body(CallRequest), **IDEMPOTENCY_DOC})
    async def call(request: Request, key: str) -> Any:
        who = await current_caller(request)
        admission.precheck(who)  # before the body is read: a tenant past its quota costs the others least
        async with limits.body_slot(who):  # a tenant's trickled bodies hold its own slots
            body = await read_body(request, CallRequest)
        session = session_for(request, who, key, body.agent)
        idempotency_key = request.headers.get("idempotency-key")
        respond_async = "respond-async" in request.headers.get("prefer", "").lower()
        if idempotency_key is not None or respond_async:  # runs in the orchestrator's task (api/handle_routes.py)
            return await submitted_call(
                request, who, session, body, key=idempotency_key, respond_async=respond_async,
                admission=admission, metrics=metrics, watch=watch,
            )  # fmt: skip
        async with admission.admit(orch(request), who, session):
            result = await _unless_gone(request, watch, session.call(body.tool, body.args, approved=body.approved))
        if result is None:
            return _stopped(request, "call")
        metrics.record(who.tenant.id, result)
        # serialized once by pydantic, not walked again by FastAPI's encoder (a hot path)
        return Response(result.model_dump_json(), media_type="application/json")

    # read by hand too: FastAPI reads a body parameter before it checks the token
    @app.post(
        "/v1/sessions/{key}/batches",
        openapi_extra={**json_body(BatchRequest), "parameters": [IDEMPOTENCY_DOC["parameters"][1]]},
    )
    async def batch(request: Request, key: str) -> Any:
        who = await current_caller(request)
        admission.precheck(who)
        async with limits.body_slot(who):
            body = await read_body(request, BatchRequest)
        session = session_for(request, who, key, body.agent)
        calls = [BatchCall(c.tool, c.args, c.id, tuple(c.depends_on)) for c in body.calls]
        try:  # every call counts; at once, as many as its widest wave
            width = max(len(wave) for wave in plan(calls, body.mode))
        except SandboxError:
            width = 1  # a bad batch: the engine refuses it before any call runs
        if (idempotency_key := request.headers.get("idempotency-key")) is not None:
            found = await keyed_batch(
                request, who, session, calls, body.mode, key=idempotency_key, slots=width,
                admission=admission, watch=watch,
            )  # fmt: skip
            if not isinstance(found, BatchResult):
                return found  # the key's refusal, or the client went away
            outcome: BatchResult | None = found
        else:
            async with admission.admit(orch(request), who, session, calls=len(calls), slots=width):
                outcome = await _unless_gone(request, watch, session.call_many(calls, mode=body.mode))
        if outcome is None:
            return _stopped(request, "batch")
        for result in outcome.results:
            metrics.record(who.tenant.id, result)
        return {
            "status": outcome.status,
            "failed": outcome.failed,
            "results": [r.model_dump(mode="json") for r in outcome.results],
        }

    @app.get("/v1/sessions/{key}/events")
    async def events(request: Request, who: CallerDep, key: str, agent: str | None = None) -> Any:
        """Server-sent events: the progress of this session's calls, as they happen."""
        session = session_for(request, who, key, agent)
        give_back = limits.open_stream(who)  # 429 past service.max_event_streams_per_tenant
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](max_buffer_size=256)

        def forward(event: Any) -> None:
            if event.session == session.key:
                with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    send.send_nowait(
                        {
                            "kind": event.kind,
                            "call_id": event.call_id,
                            "tool": event.tool,
                            "elapsed_s": round(event.elapsed_s, 3),
                            **event.detail,
                        }
                    )

        unsubscribe = orch(request).progress.subscribe(forward)

        def ended() -> None:
            unsubscribe()
            send.close()
            receive.close()
            give_back()

        async def stream() -> AsyncIterator[str]:
            yield ": connected\n\n"
            quiet_since = anyio.current_time()
            # checked every second: a stream would otherwise hold a stopping service's drain
            while not request.app.state.stopping and not await request.is_disconnected():
                with anyio.move_on_after(SSE_STOP_POLL_S):
                    item = await receive.receive()
                    yield f"event: {item['kind']}\ndata: {json.dumps(item, default=str)}\n\n"
                    quiet_since = anyio.current_time()
                    continue
                if anyio.current_time() - quiet_since >= SSE_KEEPALIVE_S:
                    yield ": keep-alive\n\n"
                    quiet_since = anyio.current_time()

        return _Counted(stream(), ended, media_type="text/event-stream")

    @app.delete("/v1/sessions/{key}")
    async def close(request: Request, who: CallerDep, key: str, agent: str | None = None) -> dict[str, Any]:
        closed = await session_for(request, who, key, agent).close()
        await admission.closed(who.tenant.id, closed)
        return {"closed": closed}


class _Counted(StreamingResponse):
    """A stream whose `ended` runs once it is over, however it ends (even never started: a
    generator's own `finally` would not run then, and the stream would stay counted)."""

    def __init__(self, content: AsyncIterator[str], ended: Callable[[], None], media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._ended = ended

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ended()


def _stopped(request: Request, what: str) -> JSONResponse:
    """The answer for a call stopped before it finished (what it started was killed)."""
    if past_drain_deadline(request.app.state):
        return JSONResponse(
            {"detail": f"the service stopped before the {what} finished; it was stopped and its commands killed"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    # nobody is listening any more; the status is for the access log
    return JSONResponse({"detail": f"the client went away; the {what} was stopped"}, status_code=499)


async def _unless_gone(request: Request, watch: StopWatch, work: Awaitable[T]) -> T | None:
    """`work`, cancelled when the client disconnects or the service's drain deadline passes."""

    async def stop() -> bool:
        # the server says "disconnected" only when asked: there is no event to wait on
        return past_drain_deadline(request.app.state) or await request.is_disconnected()

    return await watch.until_stopped(stop, work)
