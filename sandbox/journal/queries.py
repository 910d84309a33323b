"""Bounded reads of the journal: one page of events, newest first, and the cursor to the next.

A page never reads more than it returns (plus one row, to know whether there is a next page):
the filters are in the SQL, each on an index whose order is the row id's (SQLite appends the
row id to every index), so `ORDER BY id DESC LIMIT n` walks n index entries at a million rows
as at ten. Time bounds are turned into row-id bounds first, through the index on `ts`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox.errors import UsageError

MAX_PAGE = 10_000
# events are written in the order they happen, give or take this much (an egress proxy's
# request lines are collected up to minutes after they were made): time bounds are widened
# by it when turned into row ids, then applied exactly
TS_SLACK_S = 600.0
_CURSOR = re.compile(r"e([1-9][0-9]{0,18})")
_MAX_ID = 2**63 - 1

Read = Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Event:
    """One journaled stage of one call."""

    id: int
    ts: float
    trace_id: str
    call_id: str
    session: str
    tenant: str
    agent: str
    tool: str
    stage: str
    duration_ms: float | None
    data: dict[str, Any]


@dataclass(frozen=True)
class EventPage:
    """One page of events, newest first, and the cursor of the next (older) page, None at the end."""

    events: list[Event]
    next_cursor: str | None


def event_of(row: tuple[Any, ...]) -> Event:
    """An `events` row (`SELECT *`) as an :class:`Event`."""
    return Event(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9], json.loads(row[10]))


def make_cursor(event_id: int) -> str:
    """The cursor of the page that starts below `event_id` (opaque to callers)."""
    return f"e{event_id}"


def parse_cursor(cursor: str) -> int:
    """The row id a cursor stands for.

    Raises:
        UsageError: the cursor is not one this journal handed out.
    """
    found = _CURSOR.fullmatch(cursor) if len(cursor) <= 20 else None
    if found is None or int(found.group(1)) > _MAX_ID:
        raise UsageError(
            f"bad cursor {cursor[:40]!r}: pass back a page's next_cursor unchanged (omit it for the newest page)"
        )
    return int(found.group(1))


def check_limit(limit: int) -> int:
    """`limit` if it is a page size this journal serves.

    Raises:
        UsageError: below 1 or above :data:`MAX_PAGE`.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise UsageError(f"limit must be a whole number from 1 to {MAX_PAGE} (got {limit!r})")
    return limit


def capped_columns(note: str) -> str:
    """The events columns with `data` replaced by a note of its size when longer than the query's
    first parameter (bounded memory, whatever an event holds); `note` says where it is whole."""
    return (
        "id, ts, trace_id, call_id, session, tenant, agent, tool, stage, duration_ms, "
        "CASE WHEN length(data) > ? THEN json_object('truncated', json('true'), 'bytes', length(data), "
        f"'note', '{note}') ELSE data END"
    )


def page(
    read: Read,
    *,
    tenant: str | None,
    session: str | None,
    trace_id: str | None,
    since: float | None,
    until: float | None,
    cursor: str | None,
    limit: int,
    tool: str | None = None,
    max_data: int | None = None,
) -> EventPage:
    """One page of events matching every filter given, newest first (see :meth:`Journal.page`)."""
    check_limit(limit)
    where: list[str] = []
    args: list[Any] = []
    # the most selective filters given walk their index (in row-id order); `+column` keeps SQLite
    # from walking a wider one instead (a tenant's whole history for one session's page). With a
    # tenant, a session or trace walks (tenant, session|trace_id): never a neighbour's rows of a
    # same-named session (`main` is every tenant's)
    narrowest = next((c for c, v in (("trace_id", trace_id), ("session", session)) if v is not None), None)
    walked = {"tenant", narrowest}
    for column, value in (("tenant", tenant), ("session", session), ("trace_id", trace_id), ("tool", tool)):
        if value is not None:
            where.append(f"{'' if column in walked else '+'}{column} = ?")
            args.append(value)
    bounds = _id_bounds(read, since, until)
    if bounds is None:
        return EventPage([], None)
    low, high = bounds
    if cursor is not None:
        high = min(high, parse_cursor(cursor) - 1)
    where += ["id >= ?", "id <= ?"]
    args += [low, high]
    # `+ts`: the exact time filter must not make SQLite walk the ts index and sort what it finds
    if since is not None:
        where.append("+ts >= ?")
        args.append(since)
    if until is not None:
        where.append("+ts <= ?")
        args.append(until)
    columns, head = ("*", ()) if max_data is None else (capped_columns("whole in the journal"), (max_data,))
    rows = read(
        f"SELECT {columns} FROM events WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?",  # noqa: S608 - fixed words
        (*head, *args, limit + 1),
    )
    events = [event_of(row) for row in rows[:limit]]
    return EventPage(events, make_cursor(events[-1].id) if len(rows) > limit else None)


def _id_bounds(read: Read, since: float | None, until: float | None) -> tuple[int, int] | None:
    """The row ids that can hold events between `since` and `until` (None: no row can)."""
    low, high = 1, _MAX_ID
    if since is not None:
        rows = read("SELECT id FROM events WHERE ts >= ? ORDER BY ts LIMIT 1", (since - TS_SLACK_S,))
        if not rows:
            return None
        low = int(rows[0][0])
    if until is not None:
        rows = read("SELECT id FROM events WHERE ts > ? ORDER BY ts LIMIT 1", (until + TS_SLACK_S,))
        if rows:
            high = int(rows[0][0]) - 1
    return low, high
