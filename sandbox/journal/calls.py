"""Call records in the journal: the durable side of a call handle, and idempotency keys.

A call submitted as a handle (`Session.submit`, `Prefer: respond-async`) or carrying an
idempotency key gets a row here before its handler runs; the row takes the call's whole
ToolResult when it ends, so the answer outlives the process that ran it. A key is unique per
tenant: the first claim wins, a repeat reads the winner's row, and only a row older than the
key's lifetime (`journal.idempotency_ttl`) may be claimed again.

Held by :class:`~sandbox.journal.store.Journal`; writes go through its one connection and lock,
so a claim is one statement, atomic against every other writer of the file (other processes
included: SQLite's write lock).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.core import JournalCore

State = Literal["queued", "awaiting_approval", "running", "finished", "abandoned"]
# a record still `running` this long after its claim is gone whatever its state says (its process
# died where nobody saw it): deleted with the claims' clean-up, so the table stays bounded
STALE_S = 7 * 24 * 3600.0
ENDED: frozenset[str] = frozenset({"finished", "abandoned"})

_COLUMNS = "call_id, tenant, session, agent, tool, idem_key, fingerprint, state, result, reason, created, ended"


@dataclass(frozen=True)
class CallRecord:
    """One call's durable record."""

    call_id: str
    tenant: str
    session: str
    agent: str
    tool: str
    idempotency_key: str | None
    fingerprint: str
    state: State
    result: str | None  # the ToolResult as JSON, once finished
    reason: str  # why it was abandoned (who cancelled it, or what went away)
    created: float
    ended: float | None


def values(record: CallRecord) -> tuple[object, ...]:
    """A record's columns up to `reason`, in table order (each store adds its times)."""
    return (
        record.call_id,
        record.tenant,
        record.session,
        record.agent,
        record.tool,
        record.idempotency_key,
        record.fingerprint,
        record.state,
        record.result,
        record.reason,
    )


def _record(row: tuple[object, ...]) -> CallRecord:
    (call_id, tenant, session, agent, tool, key, fingerprint, state, result, reason, created, ended) = row
    return CallRecord(
        call_id=str(call_id),
        tenant=str(tenant),
        session=str(session),
        agent=str(agent),
        tool=str(tool),
        idempotency_key=None if key is None else str(key),
        fingerprint=str(fingerprint),
        state=str(state),  # type: ignore[arg-type]  # written only from State
        result=None if result is None else str(result),
        reason=str(reason),
        created=float(str(created)),
        ended=None if ended is None else float(str(ended)),
    )


class CallRecords:
    """The `calls` table's reads and writes.

    Args:
        core: the journal whose connection, lock and writer it uses.
    """

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    def claim(self, record: CallRecord, *, keep_s: float) -> CallRecord:
        """Record `record`; for a keyed one, return the live row of its key when another holds it.

        A row whose call ended more than `keep_s` ago is expired: it goes, so its key runs a new
        call; a running call's row never expires (its key would run it twice). The returned row
        is `record` itself when this claim won.
        """
        expired_before = time.time() - keep_s

        def step(db: sqlite3.Connection) -> CallRecord:
            db.execute("BEGIN IMMEDIATE")  # the read and the write are one claim, against other processes too
            try:
                # what the key's lifetime no longer keeps goes with each claim, so the table stays
                # bounded by one lifetime's calls: a key is kept `keep_s` after its call ended; a
                # running call's is never freed (it would run twice), except one left running past
                # STALE_S, whose process died unseen
                db.execute(
                    "DELETE FROM calls WHERE (state IN ('finished', 'abandoned') AND ended < ?) OR created < ?",
                    (expired_before, time.time() - max(keep_s, STALE_S)),
                )
                if record.idempotency_key is not None:
                    row = db.execute(
                        f"SELECT {_COLUMNS} FROM calls WHERE tenant = ? AND idem_key = ?",  # noqa: S608 - constant columns
                        (record.tenant, record.idempotency_key),
                    ).fetchone()
                    if row is not None:
                        db.execute("COMMIT")
                        return _record(row)
                db.execute(
                    f"INSERT INTO calls({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",  # noqa: S608 - constant columns
                    (*values(record), record.created, record.ended),
                )
                db.execute("COMMIT")
                return record
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

        try:
            with self._core._lock:
                self._core._writer.drain_locked()
                return step(self._core._db)
        except sqlite3.Error as exc:
            raise SandboxError(
                ErrorCode.INTERNAL, f"the journal at {self._core.path} cannot record the call ({exc}); it was not run"
            ) from exc

    def set_state(self, call_id: str, state: State) -> None:
        """A running call's new state (never over an ended one)."""
        self._core._write(
            "UPDATE calls SET state = ? WHERE call_id = ? AND state NOT IN ('finished', 'abandoned')",
            (state, call_id),
        )

    def end(self, call_id: str, state: Literal["finished", "abandoned"], result: str | None, reason: str = "") -> None:
        """The call's outcome: its ToolResult JSON when finished, the reason when abandoned."""
        self._core._write(
            "UPDATE calls SET state = ?, result = ?, reason = ?, ended = ? WHERE call_id = ?",
            (state, result, reason, time.time(), call_id),
        )

    def call_record(self, call_id: str) -> CallRecord | None:
        """The record of `call_id`, or None (the caller checks its tenant)."""
        query = f"SELECT {_COLUMNS} FROM calls WHERE call_id = ?"  # noqa: S608 - constant columns
        rows = self._core._read(query, (call_id,))
        return _record(rows[0]) if rows else None


class JournalCalls:
    """The journal's call records as a CallStore (sandbox/state/protocol.py): the embedded
    default. One process's waiters wake at once when it ends a call; a call another process
    ends is seen within POLL_S (the file is shared, not its events)."""

    POLL_S = 0.1
    GONE_CHECK_S = 5.0  # how often a waiter asks whether the call's process still runs
    # a record with no open call in the journal this long after its claim is nobody's (its
    # process died between the claim and the call's first stage, or the journal was pruned)
    UNOPENED_GRACE_S = 30.0

    def __init__(self, journal: Any) -> None:
        self._journal = journal
        self._ended: dict[str, anyio.Event] = {}

    async def claim_call(self, record: CallRecord, *, keep_s: float) -> CallRecord:
        """:meth:`CallRecords.claim` (one statement under the file's write lock)."""
        return self._journal.claim_call(record, keep_s=keep_s)  # type: ignore[no-any-return]

    async def set_call_state(self, call_id: str, state: State) -> None:
        """:meth:`CallRecords.set_state`."""
        self._journal.set_call_state(call_id, state)

    async def end_call(
        self, call_id: str, state: Literal["finished", "abandoned"], result: str | None, reason: str = ""
    ) -> None:
        """:meth:`CallRecords.end`, and this process's waiters wake."""
        self._journal.end_call(call_id, state, result, reason)
        event = self._ended.pop(call_id, None)
        if event is not None:
            event.set()

    async def note_durable(self, call_id: str, data: dict[str, Any]) -> None:
        """Nothing to write: the journal's `durable_started` event carries it."""
        del call_id, data

    async def orphans(self) -> list[tuple[CallRecord, dict[str, Any] | None]]:
        """None: the journal's recovery finds this state dir's open calls."""
        return []

    async def adopt_call(self, call_id: str) -> bool:
        """Whether the record still runs (the journal's open call says who owns it: its
        `take_over` moved it already)."""
        found = await self.call_record(call_id)
        return found is not None and found.state not in ENDED

    async def call_record(self, call_id: str) -> CallRecord | None:
        """:meth:`CallRecords.call_record`."""
        return self._journal.call_record(call_id)  # type: ignore[no-any-return]

    async def wait_call(self, call_id: str, timeout_s: float) -> CallRecord | None:
        """The record once the call ended, or as it is when `timeout_s` runs out (None: no such
        call). A call whose process is gone (killed, and nobody recovered it yet) is ended as
        abandoned here: nobody waits for a run that is gone."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        checked = time.monotonic()
        while True:
            event = self._ended.setdefault(call_id, anyio.Event())
            found = await self.call_record(call_id)
            if found is not None and found.state not in ENDED and time.monotonic() - checked >= self.GONE_CHECK_S:
                checked = time.monotonic()
                alive = self._journal.call_alive(call_id)
                if alive is False and self._journal.awaiting_adoption(call_id):
                    pass  # its command runs on: the next orchestrator adopts it (engine/handover.py)
                elif alive is False or (alive is None and time.time() - found.created > self.UNOPENED_GRACE_S):
                    await self.end_call(
                        call_id, "abandoned", None, "its process went away before it finished; not re-run"
                    )
                    found = await self.call_record(call_id)
            left = deadline - time.monotonic()
            if found is None or found.state in ENDED or left <= 0:
                self._ended.pop(call_id, None)  # never kept for ids nobody waits on any more
                return found
            with anyio.move_on_after(min(self.POLL_S, left)):
                await event.wait()
