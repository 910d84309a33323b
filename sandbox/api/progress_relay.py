"""Progress events across replicas: with a shared store, a session's event stream on any
replica shows the calls running on every replica (`GET /v1/sessions/{key}/events`).

Each replica sends its own calls' progress events to the others through the store's broadcast
(PostgreSQL NOTIFY), gathered for a moment so a busy replica sends one message per batch, not
per event, and replays the others' events on its own bus marked with their origin (so they are
never sent on again). Events are only for watching: one lost while a listening connection is
made again is not sent twice, and the journal (shipped to the store, state/shipping.py) stays
the record. An event is delivered only to streams of its own session, as on one replica; the
session key names the agent, and an agent is one tenant's.
"""

from __future__ import annotations

import json
import secrets
from collections import deque
from dataclasses import asdict, replace
from typing import Any

import anyio

from sandbox._log import logger
from sandbox.engine.progress import ProgressBus, ProgressEvent
from sandbox.errors import SandboxError
from sandbox.journal.redact import redact
from sandbox.state.protocol import BROADCAST_MAX_BYTES, EventStore

GATHER_S = 0.05  # how long events gather before they go out together
# an output chunk that ends inside a line keeps that line (up to this long; a longer one its last
# word) for the next chunk: masking runs chunk by chunk, and a secret split over two chunks would
# go out in two halves, whether inside a token (an OAuth provider's JWT is often 1-2 KiB) or
# between its name and its value (`password: ` then `hunter2`)
CARRY_MAX = 2048
# calls holding a line or word at most (past it, the oldest held text goes out): 8 MiB of ASCII,
# at most 32 MiB of wider characters as Python holds them
CARRIED_CALLS = 4096
BACKLOG = 10_000  # events waiting while the store is away; older ones are dropped past it
MAX_TEXT = 2000  # a relayed event's strings (an output chunk) are cut to this


class ProgressRelay:
    """This replica's end of the relay (run :meth:`run` for the service's lifespan)."""

    def __init__(self, bus: ProgressBus, store: EventStore) -> None:
        self.bus = bus
        self.store = store
        self.origin = secrets.token_hex(8)  # this process: its own events come back and are skipped
        self._waiting: deque[dict[str, Any]] = deque(maxlen=BACKLOG)
        self._ready = anyio.Event()
        # call id -> an output event of the line (or word) its last output chunk ended in
        self._carry: dict[str, ProgressEvent] = {}
        self._waited: set[str] = set()  # calls whose held text a heartbeat has seen already

    def _local(self, event: ProgressEvent) -> None:
        if event.origin:  # a relayed event is never sent on
            return
        for whole in self._at_word_ends(event):
            self._waiting.append(_wire(whole))
            self._ready.set()

    def _at_word_ends(self, event: ProgressEvent) -> list[ProgressEvent]:
        """Output chunks joined so that each ends at a line's end (or, for a line longer than
        CARRY_MAX, between two words): a secret split over two chunks is masked whole. The held
        text goes out with the next chunk, or before the call's `finished`; heartbeats leave it
        held. Past CARRIED_CALLS calls holding text (calls that never finish, or a flood of them),
        the oldest held text goes out as it is: what is held stays bounded (CARRIED_CALLS x
        CARRY_MAX characters) and nothing is lost."""
        chunk = event.detail.get("chunk") if event.kind == "output" else None
        if not isinstance(chunk, str):
            held = self._carry.get(event.call_id)
            if held is not None and (
                event.kind == "finished" or (event.kind == "running" and event.call_id in self._waited)
            ):
                # the call's end, or a second heartbeat with the text still held: output without
                # a line's end (a prompt, a progress bar) reaches watchers a heartbeat or two late
                del self._carry[event.call_id]
                self._waited.discard(event.call_id)
                return [held, event]
            if held is not None and event.kind == "running":
                self._waited.add(event.call_id)  # held through one heartbeat
            return [event]
        before = self._carry.pop(event.call_id, None)
        self._waited.discard(event.call_id)
        text = (str(before.detail["chunk"]) if before is not None else "") + chunk
        end = max(text.rfind("\n"), text.rfind("\r")) + 1
        if len(text) - end > CARRY_MAX:  # a line too long to hold: as much of its end as fits,
            # from a word's start (a name and its value are kept together where they fit)
            window = len(text) - CARRY_MAX
            blanks = [found for found in (text.find(" ", window), text.find("\t", window)) if found >= 0]
            end = min(blanks) + 1 if blanks else len(text)  # one word too long to hold: it goes
        out = [replace(event, detail={**event.detail, "chunk": text[:end]})] if end else []
        if end < len(text):
            self._carry[event.call_id] = replace(event, detail={"chunk": text[end:]})
            while len(self._carry) > CARRIED_CALLS:
                evicted = next(iter(self._carry))
                self._waited.discard(evicted)
                out.insert(0, self._carry.pop(evicted))
        return out

    def _remote(self, payload: str) -> None:
        if not payload:  # the listener connected again: nothing to replay (progress is for watching)
            return
        try:
            message = json.loads(payload)
            if not isinstance(message, dict) or message.get("origin") == self.origin:
                return
            events = [ProgressEvent(**{**item, "origin": str(message["origin"])}) for item in message["events"]]
        except (ValueError, TypeError, KeyError, RecursionError) as exc:  # not ours, or another version's
            logger.bind(error=f"{type(exc).__name__}: {exc}"[:200]).warning("progress_relay_bad_message")
            return
        for event in events:
            self.bus.emit(event)

    async def run(self) -> None:
        """Send and receive until cancelled."""
        unsubscribe = self.bus.subscribe(self._local)
        try:
            async with anyio.create_task_group() as group:
                await group.start(self.store.listen_broadcasts, self._remote)
                group.start_soon(self._send_forever)
        finally:
            unsubscribe()

    async def _send_forever(self) -> None:
        while True:
            await self._ready.wait()
            self._ready = anyio.Event()
            await anyio.sleep(GATHER_S)
            batch = list(self._waiting)
            self._waiting.clear()
            try:
                await self.store.broadcast(_payloads(self.origin, batch))
            except SandboxError as exc:  # the store away: these are lost (watching only), later ones go
                logger.bind(error=exc.message[:200], dropped=len(batch)).warning("progress_not_relayed")


def _wire(event: ProgressEvent) -> dict[str, Any]:
    item = asdict(event)
    item.pop("origin")
    # masked as the journal masks (secrets in output never leave the replica; chunks end between
    # words, ProgressRelay._at_word_ends), strings cut
    item["detail"] = redact(event.detail, max_text=MAX_TEXT)
    return item


def _payloads(origin: str, items: list[dict[str, Any]]) -> list[str]:
    """`items` as few messages as fit NOTIFY's limit; an item too large alone loses its detail."""
    head, tail = json.dumps({"origin": origin, "events": []})[:-2], "]}"
    room = BROADCAST_MAX_BYTES - len(head) - len(tail)
    out: list[str] = []
    chunk: list[str] = []
    size = 0
    for item in items:
        text = json.dumps(item, default=str)
        if len(text.encode()) > room:
            text = json.dumps({**item, "detail": {"truncated": True}}, default=str)
        cost = len(text.encode()) + (1 if chunk else 0)
        if chunk and size + cost > room:
            out.append(head + ",".join(chunk) + tail)
            chunk, size, cost = [], 0, cost - 1
        chunk.append(text)
        size += cost
    if chunk:
        out.append(head + ",".join(chunk) + tail)
    return out
