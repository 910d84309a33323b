"""Running the service: uvicorn, with a drain on SIGTERM/SIGINT.

On the signal uvicorn stops accepting connections and waits for the requests in flight. A call
still running when `grace_s` ends is stopped by the application itself (so its client gets a 503
that says so, not uvicorn's bare 500): that kills what it started in its sandbox and journals it
`abandoned`. uvicorn's own deadline comes CLEANUP_S later, so those kills (a few docker execs
each) finish before uvicorn would cancel the requests outright. Event streams end at once (they
would hold the drain to its end), and the application waits for stopped calls to finish their
clean-up before the orchestrator closes.
A SIGKILL instead leaves the clean-up to the next start's recovery.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any, TypeVar

import anyio
import uvicorn

from sandbox._log import logger

T = TypeVar("T")
STOP_POLL_S = 0.25  # how often a running call checks whether it must stop


class DrainingServer(uvicorn.Server):
    """uvicorn's server that also tells the application it is stopping (app.state.stopping)."""

    def __init__(self, config: uvicorn.Config, app: Any, grace_s: int) -> None:
        super().__init__(config)
        self._app = app
        self._grace_s = grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # plain values, set in the signal handler; the app polls them (no loop call from a handler)
        state = self._app.state
        if not state.stopping:
            state.drain_deadline = time.monotonic() + self._grace_s
            state.stopping = True
            orch = getattr(state, "orch", None)
            if orch is not None and orch.config.service.handover:
                # from now on a durable call that is stopped is left running for the next start
                orch.handover.active = True
        super().handle_exit(sig, frame)


CLEANUP_S = 15  # after the grace period: stopped calls kill what they started


def uvicorn_config(app: Any, *, host: str, port: int, graceful_s: int | None = None) -> uvicorn.Config:
    """uvicorn's settings for `app` (made by api/app.py): its HTTP protocol is the guarded one
    (api/connections.py: a request-head timeout and bounded connections), whose guard is left in
    `app.state.connections`."""
    # httptools' guarded protocol: only the HTTP service needs it, not `sandbox mcp` over stdio (StopWatch)
    from sandbox.api.connections import protocol_for

    protocol, websocket, guard = protocol_for(app.state.config.service)
    app.state.connections = guard
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        ws=websocket,  # previews' websockets: an upgraded connection stays counted (api/connections.py)
        ws_max_size=4 << 20,  # as the relay's own bound (preview/ws_relay.py)
        ws_per_message_deflate=False,  # no compression: a small frame never inflates into a large one
        log_level="warning",
        timeout_graceful_shutdown=graceful_s,
    )


def run(app: Any, *, host: str, port: int, grace_s: int) -> None:
    """Serve `app` until a signal, then drain: `grace_s` seconds for calls to finish, CLEANUP_S
    more for the stopped ones to clean up."""
    config = uvicorn_config(app, host=host, port=port, graceful_s=grace_s + CLEANUP_S)
    DrainingServer(config, app, grace_s).run()


def past_drain_deadline(state: Any) -> bool:
    """Whether a stopping service's grace period is over (calls still running must stop)."""
    deadline = state.drain_deadline
    return deadline is not None and time.monotonic() >= deadline


class StopWatch:
    """Calls that must stop once their condition says so (their client went away, or a stopping
    service's grace ended), checked together every STOP_POLL_S by one task, `run()`: a watcher
    task of its own per call cost every request about a fifth of a millisecond."""

    def __init__(self) -> None:
        self._watched: dict[anyio.CancelScope, Callable[[], Awaitable[bool]]] = {}

    async def run(self) -> None:
        """Check every watched call, forever (the app's lifespan runs it)."""
        while True:
            await anyio.sleep(STOP_POLL_S)
            for scope, stop in list(self._watched.items()):
                try:
                    if not scope.cancel_called and await stop():
                        scope.cancel()
                except Exception as exc:  # one odd connection must not end the watch of all calls
                    logger.bind(reason=str(exc)).warning("stop_check_failed")

    async def until_stopped(self, stop: Callable[[], Awaitable[bool]], work: Awaitable[T]) -> T | None:
        """`work`, cancelled (None) once `stop()` says so; a cancelled call kills what it started."""
        with anyio.CancelScope() as scope:
            self._watched[scope] = stop
            try:
                return await work
            finally:
                del self._watched[scope]
        return None

    def watching(self) -> int:
        """How many calls are watched now."""
        return len(self._watched)
