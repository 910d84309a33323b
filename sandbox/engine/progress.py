"""Progress events for UIs: a call was queued, started, is still running, finished."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sandbox._log import logger

Kind = Literal["queued", "started", "running", "output", "finished"]


@dataclass(frozen=True)
class ProgressEvent:
    """One step of one call."""

    kind: Kind
    call_id: str
    trace_id: str
    tool: str
    session: str
    elapsed_s: float
    detail: dict[str, Any] = field(default_factory=dict)
    origin: str = ""  # "" for a call of this process; another replica's id for one it relayed


Subscriber = Callable[[ProgressEvent], None]


class ProgressBus:
    """Fan-out of progress events to subscribers; a failing subscriber never breaks a call."""

    def __init__(self, heartbeat_s: float = 1.0) -> None:
        self.heartbeat_s = heartbeat_s
        self._subscribers: list[Subscriber] = []

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns the function that removes it."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    @property
    def has_subscribers(self) -> bool:
        """Whether anybody listens (events are skipped otherwise)."""
        return bool(self._subscribers)

    def emit(self, event: ProgressEvent) -> None:
        """Deliver an event to every subscriber."""
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception:
                logger.opt(exception=True).warning("progress_subscriber_failed")
