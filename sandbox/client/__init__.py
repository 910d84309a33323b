"""A typed Python client for `sandbox serve` (`pip install 'agent-sandbox[client]'`).

`Client` (sync) and `AsyncClient` speak to the service with a tenant's token; sessions return
the library's own ToolResult and BatchResult, and `AsyncClientSession` satisfies the same
`ToolSession` protocol as the library's `Session`. Refusals raise `ServiceError` subclasses with
the library's codes and `retryable`; a 429 is retried after its Retry-After. See docs/client.md.
"""

from sandbox.client.aio import AsyncCallHandle, AsyncClient, AsyncClientSession, AsyncEventStream
from sandbox.client.errors import (
    AuthenticationError,
    NotFoundError,
    RateLimitedError,
    ServiceError,
    ServiceTransportError,
)
from sandbox.client.models import Agent, CallState, Explain, LogPage, PreviewLink, SandboxInfo, SessionEvent
from sandbox.client.protocol import ToolSession
from sandbox.client.sync import CallHandle, Client, ClientSession, EventStream
from sandbox.client.wire import RetryPolicy
from sandbox.engine.batch import BatchCall, BatchResult
from sandbox.journal.approvals import Approval
from sandbox.journal.queries import Event
from sandbox.tools.spec import ErrorInfo, ToolResult

__all__ = [
    "Agent",
    "Approval",
    "AsyncCallHandle",
    "AsyncClient",
    "AsyncClientSession",
    "AsyncEventStream",
    "AuthenticationError",
    "BatchCall",
    "BatchResult",
    "CallHandle",
    "CallState",
    "Client",
    "ClientSession",
    "ErrorInfo",
    "Event",
    "EventStream",
    "Explain",
    "LogPage",
    "NotFoundError",
    "PreviewLink",
    "RateLimitedError",
    "RetryPolicy",
    "SandboxInfo",
    "ServiceError",
    "ServiceTransportError",
    "SessionEvent",
    "ToolResult",
    "ToolSession",
]
