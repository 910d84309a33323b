"""Loop detection: stop an agent that repeats itself without progress (a built-in hook pair).

Patterns over the last `window` calls of a session:
- genericRepeat: the same tool with the same arguments (poll-like tools excluded: see next);
- knownPollNoProgress: a poll-like call repeated while its result does not change;
- pingPong: two calls alternating (A, B, A, B) while neither result changes.
A count at `warn_threshold` adds a note for the model; at `critical_threshold` the call is
BLOCKED; at `global_circuit_breaker` the session refuses every call until reset.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sandbox.config.models import LoopDetectionSection

POLL_LIKE = frozenset({"process", "session_status", "sessions_list", "sessions_history"})


def fingerprint(value: Any) -> str:
    """A short stable hash of JSON-able data."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class _Session:
    history: deque[tuple[str, str, str]]  # (tool, args hash, result hash)
    tripped: bool = False
    detections: list[str] = field(default_factory=list)


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
    """Per-session loop state. Args: the `tools.loop_detection` settings."""

    def __init__(self, config: LoopDetectionSection) -> None:
        self.config = config
        self._sessions: dict[str, _Session] = {}

    def _state(self, session: str) -> _Session:
        state = self._sessions.get(session)
        if state is None:
            state = _Session(deque(maxlen=self.config.window))
            self._sessions[session] = state
        return state

    def reset(self, session: str) -> None:
        """Clear a session's history and its circuit breaker."""
        self._sessions.pop(session, None)

    def check(self, session: str, tool: str, args: dict[str, Any]) -> Verdict:
        """The verdict for a call about to run."""
        if not self.config.enabled:
            return Verdict("ok")
        state = self._state(session)
        if state.tripped:
            return Verdict("breaker")
        key = fingerprint(args)
        history = list(state.history)
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
            state.tripped = True
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

    def record(self, session: str, tool: str, args: dict[str, Any], result: Any) -> None:
        """Remember a finished (or blocked) call."""
        if self.config.enabled:
            self._state(session).history.append((tool, fingerprint(args), fingerprint(result)))
