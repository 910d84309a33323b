"""Calls as handles over HTTP (engine/handles.py, docs/calls.md).

- `POST /v1/sessions/{key}/calls` with `Prefer: respond-async` (RFC 7240) answers `202 Accepted`
  at once, `Location: /v1/calls/{id}`; with `Idempotency-Key` (and no Prefer) it waits for the
  call, which runs in the orchestrator's task either way: a client that goes away does not stop it.
- `GET /v1/calls/{id}[?wait=S]`: its state and, once finished, its ToolResult; `wait` long-polls
  up to S seconds (at most 60) for it to end.
- `DELETE /v1/calls/{id}`: cancel it (its command is killed; the record says who cancelled).

Another tenant's call id is 404, as an id that never existed.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import AsyncExitStack
from typing import Any, Literal

import anyio
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from sandbox.api.auth import CallerDep
from sandbox.api.metrics import Metrics
from sandbox.api.quotas import Admission
from sandbox.api.requests import CallRequest
from sandbox.api.serving import StopWatch, past_drain_deadline
from sandbox.api.tenants import Caller
from sandbox.engine.batch import BatchCall
from sandbox.engine.handles import CallHandle, CallStatus
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.errors import SandboxError

MAX_WAIT_S = 60.0
REPEAT_WAIT_S = 24 * 3600.0


def status_body(found: CallStatus) -> dict[str, Any]:
    """A call's status as the API shows it."""
    return {
        "call_id": found.call_id,
        "state": found.state,
        "tool": found.tool,
        "session": found.session,
        "agent": found.agent,
        "reason": found.reason,
        "result": None if found.result is None else found.result.model_dump(mode="json"),
    }


def key_refusal(exc: SandboxError) -> JSONResponse:
    """A refused key (malformed, or used for another call) as FastAPI's 422 shape: the header is the bad input."""
    problem = {"loc": ["header", "Idempotency-Key"], "msg": exc.message, "type": "idempotency_key"}
    return JSONResponse({"detail": [problem], "code": exc.code.value, **exc.details}, status_code=422)


async def submitted_call(
    request: Request,
    who: Caller,
    session: Session,
    body: CallRequest,
    *,
    key: str | None,
    respond_async: bool,
    admission: Admission,
    metrics: Metrics,
    watch: StopWatch,
) -> Response:
    """A call that runs in the orchestrator's task (a key, or `Prefer: respond-async`)."""
    orch: Orchestrator = request.app.state.orch
    guard = AsyncExitStack()
    await guard.enter_async_context(admission.admit(orch, who, session))  # a 429 is answered here
    try:
        handle = await session.submit(body.tool, body.args, idempotency_key=key, guard=guard, approved=body.approved)
    except SandboxError as exc:
        if "idempotency_key" in exc.details:
            return key_refusal(exc)
        raise
    if respond_async:
        location = f"/v1/calls/{handle.call_id}"
        found = await handle.status()
        state = found.state if found is not None else "queued"
        return JSONResponse(
            {"call_id": handle.call_id, "state": state}, status_code=202, headers={"Location": location}
        )
    found = await _waited(request, watch, handle)
    if found is None:
        # the wait stopped, not the call: it goes on, and a repeat with its key gets its result
        detail = (
            f"stopped waiting; call {handle.call_id} goes on: repeat the request (same key) "
            f"or GET /v1/calls/{handle.call_id}"
        )
        status = 503 if past_drain_deadline(request.app.state) else 499
        return JSONResponse(
            {"detail": detail, "call_id": handle.call_id}, status_code=status, headers={"Retry-After": "5"}
        )
    if found.result is None:  # abandoned: whether it ran is unknown
        detail = (
            f"call {found.call_id} was abandoned ({found.reason}): whether it ran is unknown; a new key runs it again"
        )
        return JSONResponse(
            {"detail": detail, "code": "CONFLICT", "idempotency_key": key, "first_call": found.call_id}, status_code=409
        )
    metrics.record(who.tenant.id, found.result)
    return Response(found.result.model_dump_json(), media_type="application/json")


async def keyed_batch(
    request: Request,
    who: Caller,
    session: Session,
    calls: list[BatchCall],
    mode: Literal["parallel", "sequential"],
    *,
    key: str,
    slots: int,
    admission: Admission,
    watch: StopWatch,
) -> Any:
    """A batch with `Idempotency-Key`: each call runs once under `key#n` (Session.call_many), in
    the service's task group, so a client that goes away does not stop it; a repeat gets the same
    results."""
    orch: Orchestrator = request.app.state.orch
    # a repeat while this process still runs the batch waits for that run, holding no quota: a
    # client retrying a long batch does not stack runs that each hold the batch's slots
    running: dict[tuple[str, str], tuple[anyio.Event, list[Any]]] = request.app.state.keyed_batches
    # the same batch only (session, mode, calls): another under the key goes through the keys' own check
    asked = json.dumps([session.key, mode, [(c.name, c.arguments, c.id, c.depends_on) for c in calls]], default=str)
    mine = (who.tenant.id, f"{key}|{hashlib.sha256(asked.encode()).hexdigest()}")
    if mine in running:
        done, outcome = running[mine]
    else:
        guard = AsyncExitStack()
        await guard.enter_async_context(admission.admit(orch, who, session, calls=len(calls), slots=slots))
        done, outcome = running[mine] = (anyio.Event(), [])

        async def run() -> None:
            try:
                async with guard:
                    outcome.append(await session.call_many(calls, mode=mode, idempotency_key=key))
            except Exception as exc:  # a refusal of the batch (its key, its spec): the request answers it
                outcome.append(exc)
            finally:
                running.pop(mine, None)
                done.set()

        try:
            request.app.state.spawn(run)
        except BaseException:  # the service is stopping: nothing runs, the slots go back
            running.pop(mine, None)
            await guard.aclose()
            raise

    async def finished() -> bool:
        await done.wait()
        return True

    async def stop() -> bool:
        return past_drain_deadline(request.app.state) or await request.is_disconnected()

    if await watch.until_stopped(stop, finished()) is None:
        detail = (
            f"stopped waiting; the batch with idempotency key {key!r} goes on: repeat the request to get its results"
        )
        status = 503 if past_drain_deadline(request.app.state) else 499
        return JSONResponse({"detail": detail}, status_code=status, headers={"Retry-After": "5"})
    result = outcome[0]
    if isinstance(result, SandboxError) and "idempotency_key" in result.details:
        return key_refusal(result)
    if isinstance(result, BaseException):
        raise result
    return result


async def _waited(request: Request, watch: StopWatch, handle: CallHandle) -> CallStatus | None:
    """The call's status once it ended; None when the client went away or the service is stopping."""

    async def ended() -> CallStatus | None:
        return await handle.status(wait_s=REPEAT_WAIT_S)

    async def stop() -> bool:
        return past_drain_deadline(request.app.state) or await request.is_disconnected()

    found = await watch.until_stopped(stop, ended())
    return found if found is not None and found.state in ("finished", "abandoned") else None


def add_handle_routes(app: FastAPI) -> None:
    """Register `GET` and `DELETE /v1/calls/{call_id}`."""

    async def own(request: Request, who: Caller, call_id: str, wait_s: float = 0.0) -> CallStatus | None:
        orch: Orchestrator = request.app.state.orch
        handle = orch.call(call_id)
        found = await handle.status()  # whose it is first: another tenant's id answers as fast as no id
        if found is None or found.tenant != who.tenant.id:
            return None
        return await handle.status(wait_s=wait_s) if wait_s > 0 and found.result is None else found

    def missing(call_id: str) -> JSONResponse:
        return JSONResponse({"detail": f"no call {call_id!r}", "code": "FILE_NOT_FOUND"}, status_code=404)

    @app.get("/v1/calls/{call_id}")
    async def call_status(
        request: Request, who: CallerDep, call_id: str, wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S)
    ) -> Any:
        """A call's state and, once finished, its ToolResult; `wait` long-polls for its end."""
        found = await own(request, who, call_id, wait)
        return missing(call_id) if found is None else status_body(found)

    @app.delete("/v1/calls/{call_id}")
    async def cancel_call(request: Request, who: CallerDep, call_id: str) -> Any:
        """Cancel a call: its command is killed, and its record says who cancelled it."""
        found = await own(request, who, call_id)
        if found is None:
            return missing(call_id)
        orch: Orchestrator = request.app.state.orch
        if not await orch.call(call_id).cancel(by=f"tenant {who.tenant.id} (token {who.token_name})"):
            return JSONResponse(
                {"detail": f"call {call_id} had ended ({found.state})", "code": "CONFLICT"}, status_code=409
            )
        ended = await own(request, who, call_id, 5.0)
        return status_body(ended) if ended is not None else missing(call_id)
