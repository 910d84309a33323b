"""One call on its way through the stages: who asks for what, and how each stage reports.

The stages (engine/stages.py) take a :class:`Call` and either pass (return None, or what they
found) or stop the call with a :class:`Refusal`: data, not an exception (STYLE rule 8).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandbox._log import logger
from sandbox.engine import context as ctxvars
from sandbox.engine.progress import Kind, ProgressEvent
from sandbox.errors import SandboxError
from sandbox.policy.groups import ALIASES
from sandbox.tools.spec import ErrorInfo, ToolArgs, ToolResult, ToolSpec

if TYPE_CHECKING:  # the executor imports the stages, which only need the Engine's shape
    from sandbox.engine.executor import Engine
    from sandbox.policy.resolver import ResolvedPolicy
    from sandbox.tools.context import ToolContext
    from sandbox.tools.registry import Handler

MAX_TOOL_NAME = 128  # a longer name is no tool; it is cut before it reaches the journal or logs
# stages written together with the next committed one of the same call (see Journal.append)
BUFFERED_STAGES = frozenset({"proposed", "policy_checked", "validated", "approved", "queued"})


@dataclass(frozen=True)
class Refusal:
    """Why a call stops before it runs: the journal stage to record and the error to return."""

    stage: str
    error: SandboxError


@dataclass(frozen=True)
class Checked:
    """A call whose tool exists for the session and whose arguments are valid (maybe rewritten)."""

    spec: ToolSpec
    handler: Handler
    args: ToolArgs
    params: dict[str, Any]


@dataclass(frozen=True)
class Ran:
    """What one successful run left: the handler's context (for spilling) and its output."""

    context: ToolContext
    output: Any


@dataclass
class Call:
    """The state every stage shares: the engine, the session's policy, the call's context."""

    engine: Engine
    policy: ResolvedPolicy
    name: object  # as asked for (cut when too long), for messages
    task: ctxvars.TaskContext
    started: float = field(default_factory=time.perf_counter)
    warnings: list[str] = field(default_factory=list)
    approved: str | None = None  # approved by the caller before the call (its reason): no wait

    @property
    def tool(self) -> str:
        """The normalised tool name."""
        return self.task.tool

    @property
    def tenant(self) -> str:
        """The tenant the call belongs to."""
        return self.task.tenant

    @property
    def session(self) -> str:
        """The full session key."""
        return self.task.session

    def elapsed_ms(self, digits: int = 2) -> float:
        """Milliseconds since the call began."""
        return round((time.perf_counter() - self.started) * 1000, digits)

    def event(self, kind: Kind, **detail: Any) -> None:
        """Emit a progress event of this call."""
        task = self.task
        elapsed = time.perf_counter() - self.started
        self.engine.progress.emit(
            ProgressEvent(kind, task.call_id, task.trace_id, task.tool, task.session, elapsed, detail)
        )

    def journal(self, stage: str, **data: Any) -> None:
        """Record a stage; committed before anything runs or waits and at the end, the rest rides along."""
        if self.engine.journal is None:
            return
        task = self.task
        self.engine.journal.append(
            trace_id=task.trace_id,
            call_id=task.call_id,
            session=task.session,
            tenant=task.tenant,
            agent=task.agent,
            tool=task.tool,
            stage=stage,
            duration_ms=self.elapsed_ms(3),
            data=data,
            commit=stage not in BUFFERED_STAGES,
        )

    def failed(self, error: SandboxError, output: Any = None) -> ToolResult:
        """The result of a call that ended with `error` (its `output` detail is carried apart)."""
        details = {k: v for k, v in error.details.items() if k != "output"}
        return ToolResult(
            ok=False,
            tool=self.tool,
            call_id=self.task.call_id,
            trace_id=self.task.trace_id,
            output=output,
            error=ErrorInfo(code=error.code.value, message=error.message, retryable=error.retryable, details=details),
            duration_ms=self.elapsed_ms(),
        )

    def refuse(self, refusal: Refusal) -> ToolResult:
        """Journal a refusal at its stage and return it as the call's result."""
        self.journal(refusal.stage, code=refusal.error.code.value, message=refusal.error.message)
        return self.failed(refusal.error)


def new_call_id() -> str:
    """A fresh call id (also a call handle's, engine/once.py)."""
    return ctxvars.new_id("c").replace("-", "_")


def tool_name(name: object) -> str:
    """The tool a model asked for: trimmed, lower-cased, aliases resolved, cut when absurdly long."""
    tool = name.strip().lower() if isinstance(name, str) else type(name).__name__
    tool = ALIASES.get(tool, tool)
    if len(tool) > MAX_TOOL_NAME:
        tool = f"{tool[:MAX_TOOL_NAME]}…(+{len(tool) - MAX_TOOL_NAME} chars)"
    return tool


def open_call(
    engine: Engine,
    policy: ResolvedPolicy,
    name: object,
    *,
    tenant: str,
    sender: str | None,
    trace_id: str | None,
    call_id: str | None = None,
    approved: str | None = None,
) -> Call:
    """Stage 1, context: the call's ids and who is asking (DESIGN.md, "The path of one tool call")."""
    started = time.perf_counter()
    tool = tool_name(name)
    task = ctxvars.TaskContext(
        trace_id=trace_id or ctxvars.new_id("t"),
        call_id=call_id or new_call_id(),
        tenant=tenant,
        agent=policy.agent.id,
        session=policy.session.raw,
        tool=tool,
        sender=sender,
    )
    shown = tool if len(tool) > MAX_TOOL_NAME else name  # only a cut name is longer
    return Call(engine=engine, policy=policy, name=shown, task=task, started=started, approved=approved)


@contextmanager
def bound(call: Call) -> Iterator[None]:
    """Make the call's context current: handlers see it, and every log line carries it."""
    task = call.task
    token = ctxvars.current.set(task)
    try:
        with logger.contextualize(
            trace_id=task.trace_id,
            call_id=task.call_id,
            tool=task.tool,
            session=task.session,
            agent=task.agent,
            tenant=task.tenant,
        ):
            yield
    finally:
        ctxvars.current.reset(token)
