"""The service's Prometheus metrics."""

from __future__ import annotations

from typing import Any


class Metrics:
    """The service's Prometheus metrics (one registry per app)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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

    def record(self, tenant: str, result: Any) -> None:
        code = "ok" if result.ok else (result.error.code if result.error else "error")
        self.calls.labels(result.tool, code, tenant).inc()
        self.duration.labels(result.tool).observe(result.duration_ms / 1000)
