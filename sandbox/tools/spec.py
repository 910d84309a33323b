"""ToolSpec (what a tool is) and ToolResult (what a call returns), the two shapes every layer shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Risk = Literal["low", "medium", "high"]


class ToolArgs(BaseModel):
    """Base of every tool's argument model: unknown fields are errors the model can fix."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class RetryPolicy:
    """How a tool is retried. Tools with side effects are retried only when idempotent."""

    max_attempts: int = 3
    base_s: float = 0.2
    cap_s: float = 5.0
    idempotent: bool = True

    @property
    def attempts(self) -> int:
        """Attempts actually made: one for tools that are not idempotent."""
        return self.max_attempts if self.idempotent else 1


SIDE_EFFECTS = RetryPolicy(idempotent=False)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the policy, the engine and the model see it (the handler is kept by the registry)."""

    name: str
    description: str
    parameters: type[ToolArgs]
    category: str
    risk: Risk
    timeout_s: float
    sandboxed: bool  # runs inside the sandbox when the session is sandboxed
    max_concurrency: int | None = None
    retry: RetryPolicy = RetryPolicy()
    permissions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    version: str = "1"
    requires_approval: bool = False
    # it only reads (a file, the memory, the sessions): its stages need not be on disk before
    # it runs, nor its result before the caller gets it (docs/engine.md, "What is on disk when")
    read_only: bool = False

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments, without pydantic's title noise."""
        schema = self.parameters.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema


class ErrorInfo(BaseModel):
    """The `error` member of a ToolResult."""

    code: str
    message: str
    retryable: bool = False
    details: dict[str, Any] = {}


class ToolResult(BaseModel):
    """What one tool call returns, to the model and to every API (DESIGN.md "ToolResult JSON")."""

    ok: bool
    tool: str
    call_id: str
    trace_id: str
    output: Any = None
    error: ErrorInfo | None = None
    truncated: bool = False
    full_output_path: str | None = None
    duration_ms: float = 0.0
    warnings: list[str] = []  # notes for the model (e.g. a loop warning); empty when all is well
