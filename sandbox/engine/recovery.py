"""Recovery after a restart: every call the journal shows unfinished *whose orchestrator is gone*
is settled, none is re-run. A call another live process is running (two CLI calls, the CLI beside
a service) is left alone: each call records its owner (journal/owners.py).

- awaiting_approval: still pending -> left waiting (listed by `sandbox approvals list`); decided
  while nobody waited -> `abandoned` (the caller is gone; the call is not run).
- process_started (a background exec): its process is polled where it runs -> still running:
  `process_reattached`; exited: `process_exited` with its code; container or process gone:
  `process_gone`.
- a durable call (its command runs as a process of its own: tools/handlers/durable.py), handed
  over or left by a process that died: adopted (engine/handover.py), its true outcome recorded
  once its command ends; `abandoned` when its sandbox or process is gone.
- any other stage (the orchestrator died mid-call): whatever the call started in its sandbox is
  killed, and the call is `abandoned` with that reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox.engine import handover
from sandbox.errors import SandboxError
from sandbox.journal.store import Event
from sandbox.runtime import shellwrap

if TYPE_CHECKING:
    from sandbox.engine.orchestrator import Orchestrator


async def recover(orch: Orchestrator, *, adopt: bool = True) -> list[dict[str, Any]]:
    """Settle unfinished calls; return what was decided for each (durable calls are adopted, or
    with `adopt=False` left running for an orchestrator that adopts them)."""
    journal = orch.journal
    if journal is None:
        return []
    outcomes = []
    for call_id, owner, _stage, alive in journal.open_calls():
        if alive:
            continue  # its orchestrator runs: the call is not ours to settle
        events = journal.events(call_id=call_id)
        if not events:
            continue
        last = events[-1]
        started = handover.durable_start(events)
        if started is not None and last.stage != "awaiting_approval":
            if not adopt:
                continue  # its command runs on: the next orchestrator that stays adopts it
            outcome = await handover.adopt(orch, last, owner, started)  # its command runs on: wait for it
            if not outcome:
                continue  # another process adopted it first
        else:
            outcome = await _settle(orch, last, owner)
        if outcome == "abandoned":
            await _end_record(orch, call_id)
        outcomes.append(
            {"call_id": last.call_id, "tool": last.tool, "session": last.session, "was": last.stage, "now": outcome}
        )
    return outcomes


async def _end_record(orch: Orchestrator, call_id: str) -> None:
    """A keyed or submitted call settled here ends its record too: a repeat of its key, or its
    handle, then says abandoned instead of waiting for a run that is gone."""
    store = orch.call_store
    record = await store.call_record(call_id) if store is not None else None
    if store is not None and record is not None and record.state not in ("finished", "abandoned"):
        await store.end_call(call_id, "abandoned", None, "its orchestrator process was found gone; not re-run")


def _note(orch: Orchestrator, last: Event, owner: str, stage: str, **data: Any) -> None:
    # the call stays the gone owner's: a note does not make it look alive
    handover.note_stage(orch, last, stage, data, owner=owner)


async def _settle(orch: Orchestrator, last: Event, owner: str) -> str:
    assert orch.journal is not None
    if last.stage == "awaiting_approval":
        pending = [a for a in orch.journal.approvals(None) if a.call_id == last.call_id]
        if pending and pending[-1].status == "pending":
            return "awaiting_approval"
        _note(
            orch,
            last,
            owner,
            "abandoned",
            reason="decided after the orchestrator restarted; the caller is gone, not run",
        )
        return "abandoned"
    try:
        session = orch.session(last.session, agent=last.agent)
    except Exception:
        _note(orch, last, owner, "abandoned", reason="its agent is no longer configured")
        return "abandoned"
    if last.stage in ("process_started", "process_reattached"):
        proc_id = str(last.data.get("process_id", ""))
        try:
            shell = await session.shell()
            result = await shell.run_argv(shellwrap.poll_argv(proc_id, 0, 0, shell.pid_dir))
            status = result.stdout.decode().split("\n", 1)[0].strip()
        except SandboxError as exc:
            status = f"gone ({exc.message})"
        if status == "running":
            if last.stage != "process_reattached":
                _note(orch, last, owner, "process_reattached", process_id=proc_id)
            return "process_reattached"
        if status.startswith("exited"):
            _note(orch, last, owner, "process_exited", process_id=proc_id, status=status)
            return "process_exited"
        _note(orch, last, owner, "process_gone", process_id=proc_id, reason=f"its sandbox or process is gone: {status}")
        return "process_gone"
    # died mid-call: make sure nothing of it keeps running, and never run it again. The note
    # comes first: an owner wrongly taken for gone reads it when its command dies (KILLED).
    # the owner's identity (host, boot, pid) stays in the journal's owner column, not in text a
    # model may read (KILLED's message quotes this reason)
    reason = f"its orchestrator process was found gone (or its lease lapsed) during stage {last.stage}; not re-run"
    _note(orch, last, owner, "abandoned", reason=reason)
    try:
        found = await session.shell(create=False)
        if found is not None:
            await found.kill(last.call_id, "KILL")
    except SandboxError:
        pass
    return "abandoned"
