"""Ship a replica's journal to the shared store, and keep the shared events bounded.

A call commits to its replica's own journal before it runs (a local SQLite write: fast, and
what that replica's recovery reads); this task copies the journal's new events to the shared
store in batches, after the fact, so `GET /v1/logs` on any replica shows every replica's calls.
Where it left off is the store's own newest row of this journal (`shipped_up_to`), so a
restarted replica ships what it had not shipped before it stopped (or was killed), and a batch
shipped twice lands once. What a replica whose disk is lost never shipped (its last fraction of
a second) is lost to the shared view; its own journal went with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from sandbox._log import logger
from sandbox.errors import SandboxError

if TYPE_CHECKING:
    from sandbox.config.models import RetentionConfig
    from sandbox.journal.queries import Event
    from sandbox.journal.store import Journal
    from sandbox.state.protocol import EventStore

SHIP_EVERY_S = 0.1  # a call's events reach the other replicas about this long after they happen
SHIP_BATCH = 500  # events per transaction at most (a busy replica ships full batches back to back)
RETRY_S = 1.0  # the store away: try again after this (the journal keeps what waits)
STUCK_AFTER = 3  # one batch failing this often while the store answers: shipped event by event


async def ship_journal(journal: Journal, store: EventStore, *, every_s: float = SHIP_EVERY_S) -> None:
    """Copy `journal`'s new events to `store` for as long as this runs (the service's lifespan).

    A batch the store keeps refusing while it answers otherwise (an event it cannot take) is
    shipped one event at a time, and an event still refused is left out and logged: one bad
    event never stops the log of every tenant.
    """
    origin = await anyio.to_thread.run_sync(journal.journal_id)
    shipped: int | None = None
    failures = 0
    while True:
        try:
            if shipped is None:
                shipped = await store.shipped_up_to(origin)
            found = await anyio.to_thread.run_sync(journal.committed_after, shipped, SHIP_BATCH)
            if found and failures >= STUCK_AFTER:
                await _one_by_one(store, origin, found)
            elif found:
                await store.add_events(origin, found)
            if found:
                shipped = found[-1].id
            if failures:
                logger.info("journal_shipping_resumed")
            failures = 0
            if len(found) == SHIP_BATCH:
                continue  # more waiting: no rest
        except SandboxError as exc:
            failures += 1
            if failures == 1:
                logger.bind(error=exc.message[:200]).warning("journal_not_shipped")
            await anyio.sleep(RETRY_S)
            continue
        await anyio.sleep(every_s)


async def _one_by_one(store: EventStore, origin: str, events: list[Event]) -> None:
    """Ship `events` singly, leaving out (and logging) any the store refuses; raises when the
    store does not answer at all (the batch is then tried again)."""
    await store.ping()
    for event in events:
        try:
            await store.add_events(origin, [event])
        except SandboxError as exc:
            await store.ping()  # down after all: not the event's fault, raised for a retry
            logger.bind(event_id=event.id, stage=event.stage, error=exc.message[:200]).error(
                "journal_event_not_shipped"
            )


async def keep_shared_events_bounded(store: EventStore, config: RetentionConfig) -> None:
    """Apply `journal.retention` to the shared events now and every `check_every_s` (one
    replica prunes at a time; the others skip that round)."""
    from sandbox.journal.retention import Retention

    retention = Retention.of(config)
    if retention.max_age_s is None and retention.max_bytes is None:
        return
    while True:
        try:
            report = await store.prune_events(max_age_s=retention.max_age_s, max_bytes=retention.max_bytes)
            if not report.skipped:
                logger.bind(**report.__dict__).info("shared_events_pruned")
        except SandboxError as exc:
            logger.bind(error=exc.message[:200]).warning("shared_events_not_pruned")
        await anyio.sleep(retention.every_s)
