"""ToolSpec (what a tool is) and ToolResult (what a call returns), the two shapes every layer shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Category = Literal["exec", "file", "network", "session", "ui", "automation", "memory", "messaging"]
Risk = Literal["low", "medium", "high"]


class ToolArgs(BaseModel):
    """Base of every tool's argument model: unknown fields are errors the model can fix."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the policy, the engine and the model see it (handlers are attached elsewhere)."""

    name: str
    description: str
    parameters: type[ToolArgs]
    category: Category
    risk: Risk
    timeout_s: float
    sandboxed: bool  # runs inside the sandbox when the session is sandboxed

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
