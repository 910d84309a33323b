"""Loop detection: stop an agent that repeats itself without progress (a built-in hook pair).

Patterns over the last `window` calls of a session:
- genericRepeat: the same tool with the same arguments (poll-like tools excluded: see next);
- knownPollNoProgress: a poll-like call repeated while its result does not change;
- pingPong: two calls alternating (A, B, A, B) while neither result changes.
A count at `warn_threshold` adds a note for the model; at `critical_threshold` the call is
BLOCKED; at `global_circuit_breaker` the session refuses every call until reset.

The history lives where the calls of a session meet: the journal's database (`loop_calls`,
indexed by tenant, session and id), so calls made by separate processes (one `sandbox call`
each) count together. Only digests of the masked arguments and results are kept: a digest of
raw arguments would let anyone holding the database test guesses of a weak secret.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandbox._log import logger
from sandbox.config.models import LoopDetectionSection
from sandbox.errors import SandboxError
from sandbox.journal.redact import redact

POLL_LIKE = frozenset({"process", "session_status", "sessions_list", "sessions_history"})
MAX_WINDOW = 1000  # the query reads at most this many rows, whatever the config says
MAX_MEMORY_SESSIONS = 4096  # sessions the in-memory history keeps, least recently used out

History = list[tuple[str, str, str]]  # (tool, args digest, result digest), oldest first


def fingerprint(value: Any) -> str:
    """A short stable hash of JSON-able data, taken over its masked form."""
    masked = redact(value, max_text=None)
    return hashlib.sha256(json.dumps(masked, sort_keys=True, default=str).encode()).hexdigest()[:16]


class LoopStore(Protocol):
    """Where a session's call history lives: this process's memory, the journal (JournalLoops),
    or the shared store of several replicas (a looping model spread over them is counted once)."""

    async def loop_add(self, tenant: str, session: str, tool: str, args: str, result: str) -> None: ...
    async def loop_recent(self, tenant: str, session: str, window: int) -> tuple[bool, History]: ...
    async def loop_trip(self, tenant: str, session: str) -> None: ...
    async def loop_reset(self, tenant: str, session: str) -> None: ...


class SyncLoopStore(Protocol):
    """The journal's loop history (synchronous: reads of its own connection, writes queued)."""

    def loop_add(self, tenant: str, session: str, tool: str, args: str, result: str) -> None: ...
    def loop_recent(self, tenant: str, session: str, window: int) -> tuple[bool, History]: ...
    def loop_trip(self, tenant: str, session: str) -> None: ...
    def loop_reset(self, tenant: str, session: str) -> None: ...


@dataclass
class JournalLoops:
    """The journal's history as a LoopStore (its calls are as they were: on the loop, short)."""

    journal: SyncLoopStore

    async def loop_add(self, tenant: str, session: str, tool: str, args: str, result: str) -> None:
        """See :class:`LoopStore`."""
        self.journal.loop_add(tenant, session, tool, args, result)

    async def loop_recent(self, tenant: str, session: str, window: int) -> tuple[bool, History]:
        """See :class:`LoopStore`."""
        return self.journal.loop_recent(tenant, session, window)

    async def loop_trip(self, tenant: str, session: str) -> None:
        """See :class:`LoopStore`."""
        self.journal.loop_trip(tenant, session)

    async def loop_reset(self, tenant: str, session: str) -> None:
        """See :class:`LoopStore`."""
        self.journal.loop_reset(tenant, session)


@dataclass
class MemoryLoopStore:
    """The history in this process only (an orchestrator built without a journal).

    Bounded for a service that runs for weeks: at most `max_sessions` sessions (least recently
    used out, their breaker with them) of at most MAX_WINDOW calls each; a closed session's
    state is dropped at once (:meth:`LoopDetector.forget`).
    """

    calls: OrderedDict[tuple[str, str], History] = field(default_factory=OrderedDict)
    tripped: set[tuple[str, str]] = field(default_factory=set)
    max_sessions: int = MAX_MEMORY_SESSIONS

    async def loop_add(self, tenant: str, session: str, tool: str, args: str, result: str) -> None:
        """Append one call, keeping at most MAX_WINDOW."""
        history = self._touch((tenant, session))
        history.append((tool, args, result))
        del history[:-MAX_WINDOW]

    def _touch(self, key: tuple[str, str]) -> History:
        history = self.calls.setdefault(key, [])
        self.calls.move_to_end(key)
        while len(self.calls) > self.max_sessions:
            old, _ = self.calls.popitem(last=False)
            self.tripped.discard(old)  # a breaker lives as long as its session's entry
        return history

    async def loop_recent(self, tenant: str, session: str, window: int) -> tuple[bool, History]:
        """The breaker state and the last `window` calls."""
        return (tenant, session) in self.tripped, self.calls.get((tenant, session), [])[-window:]

    async def loop_trip(self, tenant: str, session: str) -> None:
        """Trip the breaker."""
        self._touch((tenant, session))
        self.tripped.add((tenant, session))

    async def loop_reset(self, tenant: str, session: str) -> None:
        """Forget the session."""
        self.calls.pop((tenant, session), None)
        self.tripped.discard((tenant, session))


@dataclass(frozen=True)
class Verdict:
    """What the detector says about the next call."""

    level: str  # ok | warn | critical | breaker
    pattern: str = ""
    count: int = 0

    def message(self) -> str:
        """A sentence for the model."""
        if self.level == "breaker":
            return (
                "this session repeated itself too often and is stopped (loop circuit breaker); "
                "it refuses calls until it is reset"
            )
        return (
            f"loop detected ({self.pattern}, {self.count} times without progress); "
            "change approach instead of repeating the same call"
        )


class LoopDetector:
    """Loop verdicts over a session's history, kept in `store` (default: this process's memory).

    Args:
        config: the `tools.loop_detection` settings.
        store: where the history lives; the orchestrator passes its journal.
    """

    def __init__(self, config: LoopDetectionSection, store: LoopStore | None = None) -> None:
        self.config = config
        self.store: LoopStore = store if store is not None else MemoryLoopStore()

    @property
    def window(self) -> int:
        """How many past calls a verdict looks at (bounded: the query stays small)."""
        return min(self.config.window, MAX_WINDOW)

    async def reset(self, tenant: str, session: str) -> None:
        """Clear a session's history and its circuit breaker."""
        await self.store.loop_reset(tenant, session)

    async def forget(self, tenant: str, session: str) -> None:
        """A session ended: drop what this process holds of it in memory.

        The journal's history stays (it is on disk, shared with other processes, and a breaker
        tripped there must outlive a close); the in-memory store forgets the session.
        """
        if isinstance(self.store, MemoryLoopStore):
            await self.store.loop_reset(tenant, session)

    async def check(self, tenant: str, session: str, tool: str, args: dict[str, Any]) -> Verdict:
        """The verdict for a call about to run.

        Raises:
            SandboxError: INTERNAL when the history cannot be read (the call does not run).
        """
        if not self.config.enabled:
            return Verdict("ok")
        tripped, history = await self.store.loop_recent(tenant, session, self.window)
        if tripped:
            return Verdict("breaker")
        key = fingerprint(args)
        counts: list[tuple[int, str]] = []
        if tool not in POLL_LIKE:
            counts.append((1 + sum(1 for t, a, _ in history if (t, a) == (tool, key)), "genericRepeat"))
        else:
            streak, last = 1, None
            for t, a, r in reversed(history):
                if (t, a) != (tool, key) or (last is not None and r != last):
                    break
                streak, last = streak + 1, r
            counts.append((streak, "knownPollNoProgress"))
        counts.append((self._ping_pong(history, (tool, key)), "pingPong"))
        count, pattern = max(counts)
        if count >= self.config.global_circuit_breaker:
            await self.store.loop_trip(tenant, session)
            return Verdict("breaker", pattern, count)
        if count >= self.config.critical_threshold:
            return Verdict("critical", pattern, count)
        if count >= self.config.warn_threshold:
            return Verdict("warn", pattern, count)
        return Verdict("ok", pattern, count)

    @staticmethod
    def _ping_pong(history: list[tuple[str, str, str]], current: tuple[str, str]) -> int:
        # length of the alternating tail A,B,A,B,... that `current` would extend, results unchanged
        if len(history) < 1:
            return 1
        a = current
        b = history[-1][:2]
        if a == b:
            return 1
        length = 1
        results: dict[tuple[str, str], str] = {}
        for i, (t, k, r) in enumerate(reversed(history)):
            expected = b if i % 2 == 0 else a
            if (t, k) != expected or results.setdefault((t, k), r) != r:
                break
            length += 1
        return length if length >= 3 else 1

    async def record(self, tenant: str, session: str, tool: str, args: dict[str, Any], result: Any) -> None:
        """Remember a finished (or blocked) call; a history that cannot be written is logged, not fatal
        (the call has already run: its result must still reach the caller)."""
        if not self.config.enabled:
            return
        try:
            await self.store.loop_add(tenant, session, tool, fingerprint(args), fingerprint(result))
        except SandboxError as exc:
            logger.bind(reason=exc.message).warning("loop_history_not_written")
