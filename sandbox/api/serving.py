"""Running the service: uvicorn, with a drain on SIGTERM/SIGINT.

On the signal uvicorn stops accepting connections and waits for the requests in flight. A call
still running a second before `grace_s` ends is stopped by the application itself (so its client
gets a 503 that says so, not uvicorn's bare 500): that kills what it started in its sandbox and
journals it `abandoned`. Event streams end at once (they would hold the drain to its end), and
the application waits for stopped calls to finish their clean-up before the orchestrator closes.
A SIGKILL instead leaves the clean-up to the next start's recovery.
"""

from __future__ import annotations

import time
from types import FrameType
from typing import Any

import uvicorn


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
            state.drain_deadline = time.monotonic() + max(0.0, self._grace_s - 1.0)
            state.stopping = True
        super().handle_exit(sig, frame)


def run(app: Any, *, host: str, port: int, grace_s: int) -> None:
    """Serve `app` until a signal, then drain for at most `grace_s` seconds."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=grace_s)
    DrainingServer(config, app, grace_s).run()
