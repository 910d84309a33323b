"""What the service answers, as pydantic models. Where the service sends one of the library's
own shapes (ToolResult, BatchResult, the journal's Approval and Event) the client returns that
very type; only shapes the library has no model for are defined here."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from sandbox.journal.approvals import Approval
from sandbox.journal.queries import Event
from sandbox.tools.spec import ToolResult

Format = Literal["openai", "anthropic", "mcp"]
BatchMode = Literal["parallel", "sequential"]

APPROVALS: TypeAdapter[list[Approval]] = TypeAdapter(list[Approval])
APPROVAL: TypeAdapter[Approval] = TypeAdapter(Approval)
EVENTS: TypeAdapter[list[Event]] = TypeAdapter(list[Event])


class _Answer(BaseModel):
    # fields a newer service adds are ignored, not errors: an old client keeps working
    model_config = ConfigDict(extra="ignore", frozen=True)


class AgentSandbox(_Answer):
    """How an agent's sessions are sandboxed."""

    mode: str
    scope: str


class Agent(_Answer):
    """One of the tenant's agents (`GET /v1/agents`)."""

    id: str
    tenant: str | None
    sandbox: AgentSandbox


class SandboxInfo(_Answer):
    """One of the tenant's live sandboxes (`GET /v1/sandboxes`)."""

    name: str
    agent: str
    scope: str
    status: str
    created_at: str


class ExplainLayer(_Answer):
    """One policy layer and the tools left after it."""

    name: str
    remaining: list[str]


class ExplainTool(_Answer):
    """The decision about one tool: allowed or not, by which layer, list, pattern and config key."""

    name: str
    allowed: bool
    layer: str | None = None
    kind: str | None = Field(None, alias="list")  # allow | deny: the list that decided
    pattern: str | None = None
    key: str | None = None
    fix: str | None = None


class ExplainSandbox(_Answer):
    """Whether and how the session is sandboxed, and why."""

    mode: str
    scope: str
    workspace_access: str
    reason: str


class ExplainPreview(_Answer):
    """Which ports of the sandbox's loopback the service shows (docs/preview.md)."""

    ports: list[int]
    link_ttl_s: int
    max_connections: int
    key: str


class Explain(_Answer):
    """`GET /v1/explain`: the shape of `sandbox explain --json`."""

    agent: str
    session: str
    sandboxed: bool
    sandbox: ExplainSandbox
    preview: ExplainPreview | None = None
    layers: list[ExplainLayer]
    tools: list[ExplainTool]


class PreviewLink(_Answer):
    """`POST /v1/sessions/{key}/preview-links`: a signed link to a port of the session's sandbox;
    `url` is absolute (the client's base URL joined), for a browser."""

    url: str
    session: str
    port: int
    expires_at: str


class SessionEvent(_Answer):
    """One progress event of a session's call (`GET /v1/sessions/{key}/events`)."""

    kind: str  # queued | started | running | output | finished
    call_id: str
    tool: str
    elapsed_s: float
    detail: dict[str, Any] = Field(default_factory=dict)  # the kind's own fields (output text, status)

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> SessionEvent:
        """An event from the stream's JSON, whose kind-specific fields sit beside the common ones."""
        common = {k: data[k] for k in ("kind", "call_id", "tool", "elapsed_s") if k in data}
        return cls(**common, detail={k: v for k, v in data.items() if k not in common})


class LogPage(_Answer):
    """One page of the tenant's journal, newest first; `next_cursor` fetches the next (older) page."""

    events: list[Event]
    next_cursor: str | None


class CallState(_Answer):
    """A submitted (or keyed) call as `GET /v1/calls/{id}` shows it: its state and, once it
    finished, its ToolResult; an abandoned call's `reason` says why (docs/calls.md)."""

    call_id: str
    state: Literal["queued", "awaiting_approval", "running", "finished", "abandoned"]
    tool: str = ""
    session: str = ""
    agent: str = ""
    reason: str = ""
    result: ToolResult | None = None
