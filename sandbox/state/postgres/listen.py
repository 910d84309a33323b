"""Wake-ups across replicas: LISTEN on one channel over a connection of its own.

A waiter watches a key (an approval id) before it reads the row, so a NOTIFY that lands between
its read and its wait still wakes it. When the listening connection drops, it is made again and
every waiter is woken once to read again: a notification sent meanwhile is never missed, and no
waiter polls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskStatus
from loguru import logger

from sandbox.config.state import StateUrl
from sandbox.errors import SandboxError
from sandbox.state.postgres.connect import close_shielded, connect, psycopg_module

RECONNECT_S = 1.0


class Wakeups:
    """The waiters of one channel, woken by the payload of its notifications.

    Args:
        url: the store.
        channel: the channel to LISTEN on (an identifier of ours, never user input).
        on_note: given each payload instead (a channel that carries messages, not keys); after
            a reconnect it is given "" once (what was sent meanwhile is gone: read again).
    """

    def __init__(self, url: StateUrl, channel: str, on_note: Callable[[str], None] | None = None) -> None:
        self._url = url
        self._channel = channel
        self._on_note = on_note
        self._waiters: dict[str, set[anyio.Event]] = {}

    def watch(self, key: str) -> anyio.Event:
        """An event set at the next notification for `key` (or a reconnect); unwatch it after."""
        event = anyio.Event()
        self._waiters.setdefault(key, set()).add(event)
        return event

    def unwatch(self, key: str, event: anyio.Event) -> None:
        """Stop waking `event`."""
        events = self._waiters.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self._waiters[key]

    def _deliver(self, payload: str) -> None:
        if self._on_note is None:
            self._wake(payload)
            return
        try:  # anybody on the database may NOTIFY: a payload nobody expected never ends the listener
            self._on_note(payload)
        except Exception as exc:
            logger.bind(channel=self._channel, error=f"{type(exc).__name__}: {exc}"[:200]).warning("state_note_refused")

    def _wake(self, key: str) -> None:
        for event in self._waiters.get(key, ()):
            event.set()

    def _wake_all(self) -> None:
        for key in list(self._waiters):
            self._wake(key)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; started once the first LISTEN holds.

        Raises:
            SandboxError: when the first connection cannot be made (the store does not open).
        """
        pg = psycopg_module()
        started = False
        while True:
            try:
                conn: Any = await connect(self._url)
                try:
                    await conn.execute(f"LISTEN {self._channel}")
                    if not started:
                        task_status.started()
                        started = True
                    # whatever was decided (or sent) while nobody listened is read again
                    self._on_note("") if self._on_note is not None else self._wake_all()
                    async for note in conn.notifies():
                        self._deliver(note.payload)
                finally:
                    await close_shielded(conn)
            except (SandboxError, pg.Error) as exc:
                if not started:
                    raise
                logger.bind(channel=self._channel, error=str(exc)[:200]).warning("state_listen_reconnect")
                await anyio.sleep(RECONNECT_S)
