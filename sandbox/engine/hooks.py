"""before_tool_call / after_tool_call hooks: block a call, rewrite its arguments, see its result."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandbox._log import logger
from sandbox.config.plugins import hook_entry_points
from sandbox.engine.context import TaskContext
from sandbox.tools.spec import ToolResult


@dataclass(frozen=True)
class HookDecision:
    """What a before hook says: block (with a reason), rewrite the arguments, or nothing."""

    blocked: bool = False
    reason: str = ""
    params: dict[str, Any] | None = None


BeforeHook = Callable[[TaskContext, str, dict[str, Any]], Awaitable["HookDecision | dict[str, Any] | None"]]
AfterHook = Callable[[TaskContext, str, dict[str, Any], ToolResult], Awaitable["ToolResult | None"]]


def _decision(value: HookDecision | dict[str, Any] | None) -> HookDecision:
    if value is None:
        return HookDecision()
    if isinstance(value, HookDecision):
        return value
    return HookDecision(bool(value.get("blocked")), str(value.get("reason", "")), value.get("params"))


class Hooks:
    """The hook chains, run in registration order; the last 1,024 rewrites are kept for audit."""

    def __init__(self) -> None:
        self.before: list[tuple[str, BeforeHook]] = []
        self.after: list[tuple[str, AfterHook]] = []
        self.rewrites: deque[dict[str, Any]] = deque(maxlen=1024)

    def add_before(self, hook: BeforeHook, name: str | None = None) -> None:
        """Append a before_tool_call hook."""
        self.before.append((name or str(getattr(hook, "__name__", "hook")), hook))

    def add_after(self, hook: AfterHook, name: str | None = None) -> None:
        """Append an after_tool_call hook."""
        self.after.append((name or str(getattr(hook, "__name__", "hook")), hook))

    def load_entry_points(self) -> list[str]:
        """Let installed plugins register hooks: each entry point is `register(hooks)`."""
        loaded = []
        for ep in hook_entry_points():
            ep.load()(self)
            loaded.append(ep.name)
        return loaded

    async def run_before(
        self, ctx: TaskContext, tool: str, params: dict[str, Any]
    ) -> tuple[dict[str, Any], str | None, str]:
        """Run the before chain: (params, block reason or None, name of the deciding hook)."""
        rewriter = ""
        for name, hook in self.before:
            decision = _decision(await hook(ctx, tool, params))
            if decision.blocked:
                logger.bind(hook=name).info("tool_call_blocked")
                return params, decision.reason or f"blocked by hook {name}", name
            if decision.params is not None and decision.params != params:
                rewriter = name
                self.rewrites.append(
                    {
                        "ts": time.time(),
                        "call_id": ctx.call_id,
                        "tool": tool,
                        "hook": name,
                        "before": params,
                        "after": decision.params,
                    }
                )
                logger.bind(hook=name).info("tool_call_rewritten")
                params = decision.params
        return params, None, rewriter

    async def run_after(self, ctx: TaskContext, tool: str, params: dict[str, Any], result: ToolResult) -> ToolResult:
        """Run the after chain; a hook may return a replacement result (redaction)."""
        for _, hook in self.after:
            replaced = await hook(ctx, tool, params, result)
            if replaced is not None:
                result = replaced
        return result
