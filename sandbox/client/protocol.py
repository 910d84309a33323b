"""ToolSession: what agent code needs of a session, met by the library's Session and the
client's AsyncClientSession alike, so the same code runs in-process or against the service."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from sandbox.engine.batch import BatchCall, BatchResult
from sandbox.tools.spec import ToolResult


class ToolSession(Protocol):
    """A session an agent loop drives: call its tools, one or a batch at a time, then close it."""

    @property
    def key(self) -> str:
        """The session key."""
        ...

    async def call(self, name: str, arguments: Any = None, *, idempotency_key: str | None = None) -> ToolResult:
        """One tool call; a tool's failure is the ToolResult's `error`. With `idempotency_key` it
        runs once for the key: a repeat gets the first call's result (docs/calls.md)."""
        ...

    async def call_many(
        self, calls: list[BatchCall], *, mode: Literal["parallel", "sequential"] = "parallel"
    ) -> BatchResult:
        """Several calls, as the engine batches them."""
        ...

    async def close(self) -> list[str]:
        """Close the session and its descendants; the keys closed."""
        ...


__all__ = ["ToolSession"]
