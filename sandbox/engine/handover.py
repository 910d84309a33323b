"""Calls that outlive their orchestrator process: handed over when it stops (SIGTERM with
`service.handover`), adopted by the next one (or by recovery after kill -9).

A durable call (one with a record: an idempotency key, or submitted as a handle) runs its
command as a background process of its session (tools/handlers/durable.py), which journals
`durable_started` with the process id. When the process stops with handover, each such call is
journaled `handed_over` and left running: its command is not killed and its record stays open.
The next orchestrator's recovery takes each over (the journal's open-call row moves to it in one
statement, so two processes never both adopt one call), journals `adopted` naming the owner that
went, waits for the command where it runs, and records its true outcome (`finished` or
`failed`, and the call record's ToolResult). A call whose sandbox or process is gone is
`abandoned` with that reason; nothing is ever run twice.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from sandbox._log import logger
from sandbox.engine.context import TaskContext
from sandbox.engine.results import shape
from sandbox.errors import SandboxError
from sandbox.journal.schema import DURABLE_STAGES, TERMINAL
from sandbox.journal.store import Event
from sandbox.tools.handlers.durable import STARTED_STAGE, outcome, stop
from sandbox.tools.spec import ErrorInfo, ToolResult

if TYPE_CHECKING:
    from sandbox.config.models import Config
    from sandbox.engine.orchestrator import Orchestrator

HANDED_OVER = "handed_over"
ADOPTED = "adopted"
ADOPTED_ELSEWHERE = "adopted_elsewhere"  # a live process holds its record: this journal lets it go
assert {STARTED_STAGE, HANDED_OVER, ADOPTED} == DURABLE_STAGES


@dataclass
class Handover:
    """This process's durable calls, and whether it hands them over as it stops.

    `active` is set the moment the service is told to stop with `service.handover` on (from the
    signal handler: a plain attribute), so a durable call stopped at any point after that (an
    MCP call at the drain deadline, the task group's cancellation) is left running, not killed.
    """

    active: bool = False
    running: set[str] = field(default_factory=set)  # durable calls whose command runs, here
    adopted: set[str] = field(default_factory=set)  # of which adopted (they hold no admission slot)
    calls: set[str] = field(default_factory=set)  # handed over: the next orchestrator records their end

    def kept(self, call_id: str) -> bool:
        """Whether `call_id` is (or is being) handed over: its end is not this process's to record."""
        return call_id in self.calls or (self.active and call_id in self.running)

    def track(self, call_id: str, running: bool) -> None:
        """A durable call's command started (True) or its outcome is known (False) here."""
        if running:
            self.running.add(call_id)
        elif not self.kept(call_id):
            self.running.discard(call_id)
            self.adopted.discard(call_id)


def handover_on(config: Config) -> bool:
    """Whether a stopping service hands its durable calls over (`service.handover`, off unless
    set: the next start must share this state dir, see docs/calls.md)."""
    return bool(config.service.handover)


def durable_start(events: list[Event]) -> Event | None:
    """The `durable_started` event of a call's events, if its command runs as a durable process."""
    return next((e for e in reversed(events) if e.stage == STARTED_STAGE), None)


def hand_over(orch: Orchestrator) -> list[str]:
    """Journal `handed_over` for each durable call whose command still runs here (and hand
    their records to a lease that outlasts this process, in a shared store); their ids. The
    service then stops: the rest of its calls are cancelled and killed as always."""
    orch.handover.active = True
    journal = orch.journal
    if journal is None:
        return []
    handed: list[str] = []
    for call_id in sorted(orch.handover.running):
        events = journal.events(call_id=call_id)
        started = durable_start(events)
        if started is None or events[-1].stage in TERMINAL:
            continue
        note_stage(orch, events[-1], HANDED_OVER, {"process_id": started.data.get("process_id")})
        orch.handover.calls.add(call_id)
        handed.append(call_id)
    if handed:
        journal.flush()
        logger.bind(calls=len(handed)).info("calls_handed_over")
    return handed


async def adopt(orch: Orchestrator, last: Event, owner: str, started: Event) -> str:
    """Take over a durable call whose owner is gone: `adopted`, and a task that records its
    outcome; `abandoned` (with the reason) when its record, sandbox or process is gone, or
    another process adopted it first ("" then: not this one's to report)."""
    journal = orch.journal
    assert journal is not None
    if not journal.take_over(last.call_id, owner):
        return ""  # another orchestrator took it first
    proc_id = str(started.data.get("process_id", ""))
    timeout_s = float(started.data.get("timeout_s") or orch.config.tools.exec.max_timeout_s)
    note = {"process_id": proc_id, "from_owner_gone": True}
    note_stage(orch, last, ADOPTED, note)
    store = orch.call_store
    if store is not None and not await store.adopt_call(last.call_id):
        record = await store.call_record(last.call_id)
        if record is not None and record.state != "abandoned":
            # a live process holds its record (another replica adopted it, or will once this
            # one's earlier lease runs out), or already recorded its outcome (it ran it to the
            # end while this one was away): that one's to report; never killed from here
            note_stage(orch, last, ADOPTED_ELSEWHERE, {"process_id": proc_id, "state": record.state})
            return ""
        reason = "its record was settled while nobody ran it; the command was stopped"
        return await _abandon(orch, last, proc_id, reason)
    return await _watch(orch, last, proc_id, timeout_s, started.ts)


async def adopt_orphans(orch: Orchestrator) -> list[dict[str, Any]]:
    """Settle the running records of processes that are gone, found in the shared store (another
    replica's, killed: its journal is not this one's). A durable exec is adopted as after a
    restart (its note in the record says where its command runs); any other call is ended as
    abandoned and what it started in its sandbox is killed. One replica wins each record."""
    store = orch.call_store
    if store is None or orch.journal is None:
        return []
    outcomes = []
    for record, durable in await store.orphans():
        try:
            now = await _adopt_orphan(orch, store, record, durable or {})
        except Exception as exc:  # one bad record never stops the others, nor the service
            logger.bind(call_id=record.call_id, error=f"{type(exc).__name__}: {exc}"[:300]).error("orphan_not_settled")
            continue
        if now:
            outcomes.append({"call_id": record.call_id, "tool": record.tool, "session": record.session, "now": now})
    return outcomes


async def _adopt_orphan(orch: Orchestrator, store: Any, record: Any, note: dict[str, Any]) -> str:
    """Adopt or settle one orphan record ("" when it is not this process's to)."""
    try:
        agent_tenant = orch.session(record.session, agent=record.agent).agent.tenant
    except SandboxError:
        agent_tenant = None
    if agent_tenant != record.tenant:  # this replica's config does not know that session so: not ours
        logger.bind(call_id=record.call_id, tenant=record.tenant).warning("orphan_of_another_config")
        return ""
    if not await store.adopt_call(record.call_id):
        return ""  # another replica took it, or it ended meanwhile
    try:
        last = Event(
            0, time.time(), str(note.get("trace_id") or f"t-{record.call_id}"), record.call_id,
            record.session, record.tenant, record.agent, record.tool, "running", None, {},
        )  # fmt: skip
        proc_id = str(note.get("process_id") or "")
        if record.tool == "exec" and proc_id:
            note_stage(orch, last, ADOPTED, {"process_id": proc_id, "from_replica_gone": True})
            timeout_s = float(note.get("timeout_s") or orch.config.tools.exec.max_timeout_s)
            return await _watch(orch, last, proc_id, timeout_s, float(note.get("started") or record.created))
        reason = "its replica went away before it finished; what it started was stopped"
        return await _abandon(orch, last, record.call_id, reason)
    except Exception:  # taken, but it cannot be watched: ended, never left running as ours
        with anyio.CancelScope(shield=True):
            await store.end_call(record.call_id, "abandoned", None, "its replica went away; it could not be adopted")
        raise


async def _watch(orch: Orchestrator, last: Event, proc_id: str, timeout_s: float, began: float) -> str:
    """Wait, in a task of its own, for an adopted durable command and record its outcome."""
    journal = orch.journal
    assert journal is not None
    store = orch.call_store
    try:
        session = orch.session(last.session, agent=last.agent)
        found = await session.shell(create=False)
    except SandboxError as exc:
        found, session = None, None
        logger.bind(call_id=last.call_id, reason=exc.message).warning("adopt_without_session")
    if found is None or session is None:
        return await _abandon(orch, last, None, "its sandbox is gone; the command and its output went with it")
    task = TaskContext(last.trace_id, last.call_id, last.tenant, last.agent, last.session, last.tool)
    try:
        ctx = await session.tool_context(task)
    except SandboxError as exc:
        return await _abandon(orch, last, proc_id, f"its sandbox cannot be reached ({exc.message}); it was stopped")

    async def work(why_cancelled: Any) -> None:
        try:
            with session.in_use():  # an idle pause would freeze the command it waits for
                body = await outcome(ctx, proc_id, timeout_s, started=began)
            result = ToolResult(
                ok=True, tool=last.tool, call_id=last.call_id, trace_id=last.trace_id, duration_ms=_ms(began)
            )
            shaped = shape(body, orch.config.results.max_chars, None)
            result.output, result.truncated = shaped.output, shaped.truncated
            note_stage(orch, last, "finished", {"output": result.output, "adopted": True})
        except SandboxError as exc:
            partial = exc.details.get("output")
            details = {k: v for k, v in exc.details.items() if k != "output"}
            error = ErrorInfo(code=exc.code.value, message=exc.message, retryable=exc.retryable, details=details)
            result = ToolResult(
                ok=False,
                tool=last.tool,
                call_id=last.call_id,
                trace_id=last.trace_id,
                output=shape(partial, orch.config.results.max_chars, None).output if partial is not None else None,
                error=error,
                duration_ms=_ms(began),
            )
            note_stage(orch, last, "failed", {"code": exc.code.value, "message": exc.message, "adopted": True})
        except Exception as exc:  # never left running unobserved: it stops, and says why
            with anyio.CancelScope(shield=True):
                reason = f"its adoption failed ({type(exc).__name__}: {exc}); the command was stopped"
                with contextlib.suppress(SandboxError):
                    await stop(ctx, proc_id)
                await _end(orch, last, reason)
            raise
        except BaseException:
            with anyio.CancelScope(shield=True):
                if orch.calls.cancelled_by_someone(last.call_id):  # its handle's cancel: it stops
                    with contextlib.suppress(SandboxError):
                        await stop(ctx, proc_id)
                    await _end(orch, last, why_cancelled())
                elif not orch.handover.kept(last.call_id):  # this orchestrator closes: the next one adopts it
                    orch.handover.calls.add(last.call_id)
                    note_stage(orch, last, HANDED_OVER, {"process_id": proc_id})
                    journal.flush()
            raise
        orch.handover.track(last.call_id, False)
        if store is not None:
            await store.end_call(last.call_id, "finished", result.model_dump_json(), "")

    orch.handover.track(last.call_id, True)
    orch.handover.adopted.add(last.call_id)
    orch.calls.start(last.call_id, work)
    return ADOPTED


async def _end(orch: Orchestrator, last: Event, reason: str) -> None:
    """Journal `abandoned` with `reason` and end the record so."""
    orch.handover.track(last.call_id, False)
    note_stage(orch, last, "abandoned", {"reason": reason})
    if orch.call_store is not None:
        await orch.call_store.end_call(last.call_id, "abandoned", None, reason)


async def _abandon(orch: Orchestrator, last: Event, proc_id: str | None, reason: str) -> str:
    note_stage(orch, last, "abandoned", {"reason": reason})
    if proc_id:
        try:
            session = orch.session(last.session, agent=last.agent)
            shell = await session.shell(create=False)
            if shell is not None:
                await shell.kill(proc_id, "KILL")
        except SandboxError:
            pass
    store = orch.call_store
    if store is not None:
        record = await store.call_record(last.call_id)
        if record is not None and record.state not in ("finished", "abandoned"):
            await store.end_call(last.call_id, "abandoned", None, reason)
    return "abandoned"


def note_stage(orch: Orchestrator, last: Event, stage: str, data: dict[str, Any], owner: str | None = None) -> None:
    """Journal `stage` for the call of `last` (as `owner`: None, this process; recovery notes
    for an owner that is gone, so the note does not make the call look alive)."""
    assert orch.journal is not None
    orch.journal.append(
        trace_id=last.trace_id,
        call_id=last.call_id,
        session=last.session,
        tenant=last.tenant,
        agent=last.agent,
        tool=last.tool,
        stage=stage,
        data=data,
        owner=owner,
    )


def _ms(began: float) -> float:
    return round((time.time() - began) * 1000, 1)
