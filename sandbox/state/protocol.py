"""The state store protocol: what replicas must agree on, behind one narrow async interface.

Two implementations: SQLite (sqlite/store.py, the default: a file in state_dir, nothing to
install) and PostgreSQL (postgres/store.py: the shared store of several replicas). One contract
suite (tests/contract/test_state_contract.py) runs against both.

This first slice holds the cross-replica correctness core: quota reservations with rate
windows, taken in one transaction and held under the owner's lease, and approvals decided once
and woken across replicas. The journal's events, open calls, loop history and the sessions
registry follow (docs/state.md, "What is in the store").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio
from anyio.abc import TaskStatus

from sandbox.journal.approvals import Approval
from sandbox.journal.calls import CallRecord, State
from sandbox.journal.queries import Event, EventPage

__all__ = [
    "Approval",
    "ApprovalStore",
    "CallRecord",
    "CallStore",
    "EventStore",
    "QuotaLimits",
    "QuotaStore",
    "Refused",
    "Reservation",
    "SandboxMakes",
    "SessionRecords",
    "SessionUids",
    "SharedCalls",
    "SharedEngineState",
    "SharedLoops",
    "SharedPoolClaims",
    "SharedPrune",
    "SharedStore",
    "StateStore",
    "TokenStore",
    "TrackedCalls",
]


@dataclass(frozen=True)
class QuotaLimits:
    """A tenant's quotas the store counts (`tenants[].quotas`); 0 means no bound."""

    max_concurrent_calls: int = 0
    max_calls_per_minute: int = 0
    max_sessions: int = 0


@dataclass(frozen=True)
class Reservation:
    """What one admitted request holds: `slots` toward the concurrency, `calls` starts in the
    window, and `session`, a new session key it claimed toward max_sessions (None: none)."""

    id: str
    tenant: str
    calls: int
    slots: int
    session: str | None = None


@dataclass(frozen=True)
class Refused:
    """Why a reservation was refused: the quota, what is held toward it, and when to try again."""

    quota: Literal["max_concurrent_calls", "max_calls_per_minute", "max_sessions", "max_sandboxes"]
    held: int  # calls running, call starts in the last minute, open sessions or sandboxes
    limit: int
    retry_after_s: int


class QuotaStore(Protocol):
    """Per-tenant admission shared by every process on the store."""

    async def reserve(
        self, tenant: str, limits: QuotaLimits, *, calls: int = 1, slots: int = 1, session: str | None = None
    ) -> Reservation | Refused:
        """Check and take `slots` concurrency slots and `calls` rate-window starts in one transaction.

        Reservations of owners whose lease has run out (a replica killed) no longer count.
        A request larger than a limit is the caller's to refuse (it can never fit).

        With `session` and `limits.max_sessions`, the session key counts too, in the same
        transaction: a key the tenant holds open costs nothing; a new key is *claimed* (shared by
        every request that reaches it before one is admitted) until :meth:`confirm_session` makes
        it open or the last claiming request is refunded.
        """
        ...

    async def confirm_session(self, reservation: Reservation, limit: int) -> bool:
        """The request was admitted: the session key it claimed is the tenant's open session now.

        If the claim went meanwhile (the key was closed while its first request was admitted,
        or the claim was lost), the key takes a place again only when one of `limit` is free:
        False when none is (the caller refuses the request)."""
        ...

    async def close_sessions(self, tenant: str, keys: list[str]) -> None:
        """Sessions closed: they no longer count toward max_sessions."""
        ...

    async def release(self, reservation: Reservation) -> None:
        """The call ended: its slots go back (its starts stay in the window)."""
        ...

    async def refund(self, reservation: Reservation) -> None:
        """The request was refused after it reserved: its slots, its starts and its share of a
        session claim go back."""
        ...

    async def in_flight(self, tenant: str) -> int:
        """Slots held now by live owners for `tenant`."""
        ...

    async def renew_lease(self) -> None:
        """Extend this owner's lease (the store does it by itself while open; exposed for tests)."""
        ...


class ApprovalStore(Protocol):
    """Approvals every replica sees, decided once, waking their waiter wherever it runs."""

    async def add_approval(self, approval: Approval) -> None:
        """Record a pending approval with its exact arguments."""
        ...

    async def decide(self, approval_id: str, status: str, reason: str = "") -> Approval:
        """Approve, deny, expire or cancel a pending approval: exactly one decision ever wins.

        Raises:
            SandboxError: INVALID_ARGUMENTS for an unknown id; CONFLICT when already decided.
        """
        ...

    async def approval(self, approval_id: str, *, raw: bool = False) -> Approval | None:
        """One approval, or None; a pending one's arguments masked unless `raw`."""
        ...

    async def approvals(self, status: str | None = "pending", *, raw: bool = False) -> list[Approval]:
        """Approvals (pending by default), oldest first; pending arguments masked unless `raw`."""
        ...

    async def wait_decided(self, approval_id: str, timeout_s: float) -> Approval | None:
        """Wait until the approval is decided (through any process) or `timeout_s` passes.

        Returns:
            The decided approval, or None when it is still pending (or gone) at the timeout.
        """
        ...


class StateStore(QuotaStore, ApprovalStore, Protocol):
    """The whole store: what `open_store` yields."""

    kind: Literal["sqlite", "postgresql"]
    owner: str  # this process's owner identity (its reservations expire with its lease)

    async def ping(self) -> None:
        """One cheap round trip (readiness).

        Raises:
            SandboxError: SERVICE_UNAVAILABLE when the store does not answer.
        """
        ...


class CallStore(Protocol):
    """Call records: a call's idempotency key, its state while it runs, and its ToolResult once it
    ended, so a repeat of the key gets the same call (docs/calls.md). The journal holds them by
    default (journal/calls.py: JournalCalls)."""

    async def claim_call(self, record: CallRecord, *, keep_s: float) -> CallRecord:
        """Record `record`; for a keyed one whose key a live record of its tenant holds (younger
        than `keep_s`), that record instead, unchanged. The one returned is `record` when it won."""
        ...

    async def set_call_state(self, call_id: str, state: State) -> None:
        """A running call's new state (never over an ended one)."""
        ...

    async def end_call(
        self, call_id: str, state: Literal["finished", "abandoned"], result: str | None, reason: str = ""
    ) -> None:
        """The call's outcome: its ToolResult as JSON when finished, the reason when abandoned."""
        ...

    async def adopt_call(self, call_id: str) -> bool:
        """Make this process the owner of a running record whose owner is gone (its command is
        adopted: engine/handover.py), in one step: False when it ended meanwhile, its owner
        lives, or another process adopted it first."""
        ...

    async def note_durable(self, call_id: str, data: dict[str, Any]) -> None:
        """What another process needs to adopt the call's durable command (engine/handover.py):
        its process id, timeout, trace and start."""
        ...

    async def orphans(self) -> list[tuple[CallRecord, dict[str, Any] | None]]:
        """Running records whose owner is gone, each with its durable note (None: none), for
        this process to adopt or settle. The embedded default answers none: its journal's
        recovery finds them."""
        ...

    async def call_record(self, call_id: str) -> CallRecord | None:
        """The record of `call_id` (None: none); the caller checks its tenant."""
        ...

    async def wait_call(self, call_id: str, timeout_s: float) -> CallRecord | None:
        """The record once the call ended, or as it is when `timeout_s` runs out."""
        ...


BROADCAST_MAX_BYTES = 7900  # PostgreSQL's NOTIFY payload is under 8000 bytes


@dataclass(frozen=True)
class SharedPrune:
    """What one prune of the shared events did (`skipped`: another replica was pruning)."""

    deleted: int
    bytes_before: int
    seconds: float
    skipped: bool = False


class EventStore(Protocol):
    """The journal's events of every replica (state/shipping.py ships each journal's new events
    here after the fact; each replica's own journal stays the record a call commits to)."""

    async def ping(self) -> None:
        """One cheap round trip (SandboxError SERVICE_UNAVAILABLE when the store does not answer)."""
        ...

    async def shipped_up_to(self, origin: str) -> int:
        """How far journal `origin` was shipped (0: never), kept when retention removed its rows."""
        ...

    async def add_events(self, origin: str, events: list[Event]) -> None:
        """Store `events` of journal `origin` (an event already there is skipped)."""
        ...

    async def events_page(
        self,
        *,
        tenant: str | None,
        session: str | None = None,
        trace_id: str | None = None,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 100,
        tool: str | None = None,
    ) -> EventPage:
        """One page of every replica's events, newest first (Journal.page's contract).

        Raises:
            UsageError: a bad limit or cursor.
            SandboxError: SERVICE_UNAVAILABLE when the store does not answer.
        """
        ...

    async def prune_events(self, *, max_age_s: float | None, max_bytes: int | None) -> SharedPrune:
        """Apply `journal.retention`'s bounds to the shared events (one process at a time)."""
        ...

    async def broadcast(self, payloads: list[str]) -> None:
        """Send each payload (text of at most BROADCAST_MAX_BYTES) to every listening process."""
        ...

    async def listen_broadcasts(
        self, on_note: Callable[[str], None], *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Give `on_note` every payload broadcast from now on (this process's own too), until
        cancelled; started once listening holds. What is sent while the listening connection is
        being made again is missed (progress is for watching, the journal is the record)."""
        ...


class TokenStore(Protocol):
    """Tenant tokens' hashes every replica takes (the embedded default keeps them in the state
    dir's token file, api/token_file.py)."""

    async def add_token(self, tenant: str, name: str, sha256: str) -> None:
        """Store a token's hash.

        Raises:
            UsageError: the tenant already has a token of that name.
        """
        ...

    async def remove_token(self, tenant: str, name: str) -> bool:
        """Delete a token's hash (False: none of that name)."""
        ...

    async def tokens(self) -> list[dict[str, str]]:
        """Every stored token: {tenant, name, sha256}."""
        ...

    async def listen_tokens(
        self, on_change: Callable[[str], None], *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Call `on_change` at each change of the tokens made through any process (and once
        after a lost connection is made again), until cancelled; started once listening holds."""
        ...


class TrackedCalls(Protocol):
    """Calls without a key, recorded only while they run (the shared store): a replica that is
    gone leaves its running ones for another replica to settle (engine/handover.py), which kills
    what they started. Their results are not kept (nothing asks for them again)."""

    async def track_call(self, record: CallRecord) -> None:
        """Record a running call of this process (one statement: its owner's lease with it)."""
        ...

    async def untrack_call(self, call_id: str) -> None:
        """The call ended here: its record goes (left alone if another process took it over)."""
        ...


class SessionUids(Protocol):
    """Session uids of the containers sessions share (runtime/session_users.py), the same on
    every replica; the embedded default keeps them in the state dir's registry files."""

    async def session_uid(self, scope: str, session: str) -> tuple[int, str] | None:
        """The uid and record token `session` holds in the container `scope`, or None."""
        ...

    async def claim_uid(self, scope: str, uid: int, session: str, token: str) -> tuple[str, str] | None:
        """Take `uid` of `scope` for `session` whole or not at all: who holds it afterwards
        (session, token); None when `session` took another uid meanwhile (ask `session_uid`)."""
        ...


class SharedPoolClaims(Protocol):
    """Warm-pool members handed out by replicas on one engine (runtime/docker/pool.py)."""

    async def claim_member(self, container_id: str, session: str) -> bool:
        """Claim the pool member `container_id` for `session`: False when another process did."""
        ...


class SessionRecords(Protocol):
    """Small records of one session that every replica serving it must see (its background
    processes: tools/process_table.py), as text by kind and key."""

    async def session_record(self, tenant: str, session: str, kind: str, key: str) -> str | None:
        """One record, or None."""
        ...

    async def session_records(self, tenant: str, session: str, kind: str) -> dict[str, str]:
        """Every record of one kind, by key."""
        ...

    async def put_session_record(
        self, tenant: str, session: str, kind: str, key: str, value: str | None, *, only_existing: bool = False
    ) -> None:
        """Record `value` (None: delete the record; `only_existing`: replace only a record that is there)."""
        ...


class SharedLoops(Protocol):
    """Loop detection's history (engine/loops.py's LoopStore), shared by every replica."""

    async def loop_add(self, tenant: str, session: str, tool: str, args: str, result: str) -> None:
        """Append one call of a session (its arguments' and result's fingerprints)."""
        ...

    async def loop_recent(self, tenant: str, session: str, window: int) -> tuple[bool, list[tuple[str, str, str]]]:
        """Whether the session's breaker is tripped, and its last `window` calls, oldest first."""
        ...

    async def loop_trip(self, tenant: str, session: str) -> None:
        """Trip the session's breaker."""
        ...

    async def loop_reset(self, tenant: str, session: str) -> None:
        """Forget the session's calls so far and reset its breaker."""
        ...


class SandboxMakes(Protocol):
    """Sandboxes being made, toward a tenant's max_sandboxes across replicas on one engine."""

    async def take_sandbox(
        self, tenant: str, sandbox: str, limit: int, listed: Callable[[], Awaitable[set[str]]]
    ) -> str | Refused | None:
        """Count `sandbox` (a name unique to it, e.g. its container's) toward `tenant`'s `limit`.

        The make is recorded first, under the tenant's lock, with the makes of other running
        calls read in the same step; `listed` (the tenant's live sandboxes, from the engine) is
        read after, with no lock held. A make released in between has its sandbox in that list,
        and a make recorded later counts this one: of two replicas making the last sandbox, the
        later refuses.

        Returns:
            None when `sandbox` is live already (nothing to make); the id of the make to give
            back with :meth:`release_sandbox` when the call ends; Refused past the limit.
        """
        ...

    async def release_sandbox(self, make_id: str) -> None:
        """The call that made (or tried to make) the sandbox ended: the engine's list says the rest."""
        ...


class SharedEngineState(SessionUids, SharedPoolClaims, SessionRecords, SharedLoops, SandboxMakes, Protocol):
    """What replicas on one engine must agree on: session uids and pool members (never handed
    out twice), and the sessions' small records."""


class SharedCalls(CallStore, TrackedCalls, Protocol):
    """The call records of the shared store: keyed and submitted calls, and unkeyed ones while they run."""


class SharedStore(StateStore, SharedCalls, EventStore, TokenStore, SharedEngineState, Protocol):
    """The store several replicas share (PostgreSQL): the whole store, the call records, the
    events and the tokens, which the embedded default keeps in state_dir's files instead."""
