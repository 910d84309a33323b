"""The service's Prometheus metrics.

Every label value comes from a bounded set: a tool is one of the registry's names or `unknown`
(a made-up tool name per call was a new series each: 1,280 lines from one batch), a code is an
ErrorCode, a tenant is one of the config's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandbox.errors import ErrorCode

UNKNOWN_TOOL = "unknown"
_CODES = frozenset({"ok", "error"} | {c.value for c in ErrorCode})


class Metrics:
    """The service's Prometheus metrics (one registry per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "sandbox_calls_total",
            "Tool calls by tool, result code and tenant",
            ["tool", "code", "tenant"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "sandbox_call_duration_seconds", "Tool call duration", ["tool"], registry=self.registry
        )
        self.in_flight = Gauge(
            "sandbox_calls_in_flight", "Calls running now, by tenant", ["tenant"], registry=self.registry
        )
        self.queue_depth = Gauge(
            "sandbox_queue_depth", "Calls waiting for a concurrency slot (limits.queue)", registry=self.registry
        )
        self.sandboxes = Gauge(
            "sandbox_sandboxes", "Sandboxes of this instance by state", ["state"], registry=self.registry
        )

        self.tools: frozenset[str] = frozenset()

    def know_tools(self, names: Iterable[str]) -> None:
        """The tool names that may be label values (the registry's); any other is `unknown`."""
        self.tools = frozenset(names)

    def tool_label(self, name: str) -> str:
        """`name` if it is a known tool, else `unknown`."""
        return name if name in self.tools else UNKNOWN_TOOL

    def record(self, tenant: str, result: Any) -> None:
        """Count one call's ToolResult (and its duration) under bounded labels."""
        self.record_body(tenant, result.model_dump(include={"ok", "tool", "error", "duration_ms"}))

    def record_body(self, tenant: str, body: dict[str, Any]) -> None:
        """Count one call from its ToolResult JSON (what MCP returns) under bounded labels."""
        error = body.get("error") or {}
        code = "ok" if body.get("ok") else str(error.get("code", "error"))
        if code not in _CODES:
            code = "error"
        tool = self.tool_label(str(body.get("tool", "")))
        self.calls.labels(tool, code, tenant).inc()
        self.duration.labels(tool).observe(float(body.get("duration_ms") or 0) / 1000)
