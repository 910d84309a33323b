"""Events across replicas: each replica's journal shipped to PostgreSQL (state/shipping.py), read
as one newest-first log with the journal's own page contract, per tenant, bounded by
`journal.retention` (a real server from Debian's packages, tests/pg_server.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.config.state import parse_state_url
from sandbox.errors import UsageError
from sandbox.journal.queries import Event
from sandbox.journal.store import Journal
from sandbox.state import open_store
from sandbox.state.admin import migrate_store
from sandbox.state.postgres import events as pg_events
from sandbox.state.postgres.store import PostgresStore
from sandbox.state.shipping import ship_journal

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
async def stores(pg_url: str, tmp_path: Path) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two replicas' stores on one database."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_store(url, tmp_path, owner="a@elsewhere|boot|1|1"))
        b = await stack.enter_async_context(open_store(url, tmp_path, owner="b@elsewhere|boot|1|1"))
        yield a, b  # type: ignore[misc]


def _fill(journal: Journal, tenant: str, calls: int, session: str = "agent:main:s1") -> None:
    for n in range(calls):
        for stage in ("started", "finished"):
            journal.append(
                trace_id=f"t_{tenant}_{n}",
                call_id=f"c_{tenant}_{n}",
                session=session,
                tenant=tenant,
                agent="main",
                tool="exec",
                stage=stage,
                data={"n": n},
            )


async def _ship_until(journal: Journal, store: PostgresStore, count: int, tenant: str) -> None:
    """Run the shipper until the store holds `count` events of `tenant`."""
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: ship_journal(journal, store, every_s=0.02))
        with anyio.fail_after(20):
            while len((await store.events_page(tenant=tenant, limit=10_000)).events) < count:
                await anyio.sleep(0.02)
        group.cancel_scope.cancel()


def _same(shared: list[Event], local: list[Event]) -> bool:
    def strip(e: Event) -> tuple[Any, ...]:
        return (e.ts, e.trace_id, e.call_id, e.session, e.tenant, e.agent, e.tool, e.stage, e.data)

    return [strip(e) for e in shared] == [strip(e) for e in local]


async def test_a_replicas_journal_is_read_on_another_with_the_journals_own_pages(
    stores: tuple[PostgresStore, PostgresStore], tmp_path: Path
) -> None:
    a, b = stores
    journal = Journal(tmp_path / "a.sqlite3")
    try:
        _fill(journal, "acme", 30)
        _fill(journal, "acme", 5, session="agent:main:other")
        _fill(journal, "globex", 7)
        await _ship_until(journal, a, 70, "acme")
        # read through the other replica's store: every page as the journal's own, newest first
        queries: list[dict[str, Any]] = [{}, {"session": "agent:main:other"}, {"trace_id": "t_acme_3"}]
        for query in queries:
            shared, local, cursor, local_cursor = [], [], None, None
            while True:
                page = await b.events_page(tenant="acme", cursor=cursor, limit=7, **query)
                shared += page.events
                local_page = journal.page(tenant="acme", cursor=local_cursor, limit=7, **query)
                local += local_page.events
                assert (page.next_cursor is None) == (local_page.next_cursor is None)
                if page.next_cursor is None:
                    break
                cursor, local_cursor = page.next_cursor, local_page.next_cursor
            assert local and _same(shared, local), query
        # a tenant never sees another's events, whatever it filters on
        assert {e.tenant for e in (await b.events_page(tenant="globex", limit=1000)).events} == {"globex"}
        assert (await b.events_page(tenant="globex", trace_id="t_acme_3", limit=10)).events == []
        # time bounds, as the journal applies them
        middle = local[len(local) // 2].ts
        since = await b.events_page(tenant="acme", since=middle, limit=1000)
        assert _same(since.events, journal.page(tenant="acme", since=middle, limit=1000).events)
        with pytest.raises(UsageError):
            await b.events_page(tenant="acme", cursor="not-a-cursor")
    finally:
        journal.close()


async def test_a_restarted_shipper_goes_on_where_it_left_and_two_journals_make_one_log(
    stores: tuple[PostgresStore, PostgresStore], tmp_path: Path
) -> None:
    a, b = stores
    first, second = Journal(tmp_path / "a.sqlite3"), Journal(tmp_path / "b.sqlite3")
    try:
        _fill(first, "acme", 10)
        await _ship_until(first, a, 20, "acme")
        _fill(first, "acme", 5)
        _fill(second, "acme", 4, session="agent:main:b")
        await _ship_until(first, a, 30, "acme")  # a new shipper of the same journal: only the 10 new
        await _ship_until(second, b, 38, "acme")
        rows = (await a.events_page(tenant="acme", limit=1000)).events
        assert len(rows) == 38  # no event twice
        assert len({e.id for e in rows}) == 38
        assert await a.shipped_up_to(first.journal_id()) == first.last_event_id()
        assert await a.shipped_up_to(second.journal_id()) == second.last_event_id()
        # a batch shipped again (a replica killed after the insert, before it knew) lands once
        await a.add_events(first.journal_id(), first.committed_after(0, 1000))
        assert len((await a.events_page(tenant="acme", limit=1000)).events) == 38
    finally:
        first.close()
        second.close()


def _event(n: int, ts: float, tenant: str = "acme") -> Event:
    return Event(n, ts, f"t{n}", f"c{n}", "agent:main:s1", tenant, "main", "exec", "finished", 1.0, {"x": "y" * 200})


async def test_retention_bounds_the_shared_events_by_age_and_by_size(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = stores
    now = time.time()
    old = [_event(n, now - 40 * 86400) for n in range(1, 301)]
    new = [_event(n, now - 60) for n in range(301, 2301)]
    await a.add_events("j1", old + new)
    await a.add_events("j1", new[:500])  # shipped again: lands once, and leaves gaps in the ids
    await a.add_events("j2", [_event(n, now - 30) for n in range(1, 11)])
    report = await b.prune_events(max_age_s=30 * 86400, max_bytes=None)
    assert report.deleted == 300 and not report.skipped
    kept = (await a.events_page(tenant="acme", limit=10_000)).events
    assert len(kept) == 2010 and min(e.ts for e in kept) > now - 3600
    # the size bound: exact counts (gaps in the ids are not rows), the oldest go first
    async with a._conn() as conn:
        rows, total = await pg_events.size(conn)
        assert rows == 2010
        cur = await conn.execute("SELECT count(*), sum(bytes) FROM sbx_events")
        assert await cur.fetchone() == (rows, total)
    bound = total // 4
    await a.prune_events(max_age_s=None, max_bytes=bound)
    kept = (await a.events_page(tenant="acme", limit=10_000)).events
    async with a._conn() as conn:
        rows, left = await pg_events.size(conn)
    assert rows == len(kept) and 0 < left <= bound and left > bound * 0.8, (rows, left, bound)
    assert {e.call_id for e in kept} >= {f"c{n}" for n in range(1, 11)}  # j2's, shipped last, stay
    # a bound above the size deletes nothing
    assert (await a.prune_events(max_age_s=None, max_bytes=total)).deleted == 0
    # retention removed all of j1's oldest rows: a restarted shipper of j1 starts after them
    assert await a.shipped_up_to("j1") == 2300


class _ClockAhead:
    """A replica's clock two hours ahead of the database's (a fault: its time source drifted)."""

    @staticmethod
    def time() -> float:
        return time.time() + 7200


async def test_a_replica_whose_clock_runs_ahead_prunes_by_the_databases_clock(
    stores: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The age cutoff is taken on the server's clock: a replica two hours ahead, pruning with a
    one-hour retention, deletes none of the events, approvals and loop breakers of the last
    minute (with its own clock it deleted them all), and still deletes what is old."""
    from sandbox.journal.approvals import Approval
    from sandbox.state.postgres import shared_rows

    a, b = stores
    now = time.time()
    await a.add_events("j1", [_event(n, now - 60) for n in range(1, 11)] + [_event(11, now - 7 * 86400)])
    await a.add_approval(
        Approval("ap", "c1", "acme", "agent:main:s1", "main", "write", {"content": "x"}, "pending", "", now, None)
    )
    await a.decide("ap", "denied", "no")
    await a.loop_trip("acme", "agent:main:s1")
    monkeypatch.setattr(shared_rows, "time", _ClockAhead, raising=False)
    report = await b.prune_events(max_age_s=3600, max_bytes=None)
    assert not report.skipped and report.deleted == 1
    kept = (await a.events_page(tenant="acme", limit=100)).events
    assert sorted(e.call_id for e in kept) == sorted(f"c{n}" for n in range(1, 11))
    assert await a.approval("ap") is not None
    assert (await a.loop_recent("acme", "agent:main:s1", 10))[0]


async def test_a_tenant_flooding_the_shared_events_pushes_out_its_own_rows_not_a_neighbours(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """`quiet` shipped 20 rows first, then `noisy` 2,000 and `busy` 600: over the size bound the
    oldest rows are quiet's, yet quiet keeps them all; noisy and busy each give up their oldest,
    down to the same level, and the table ends within the bound."""
    a, _ = stores
    now = time.time()
    quiet = [_event(n, now - 600, "quiet") for n in range(1, 21)]
    noisy = [_event(n, now - 300, "noisy") for n in range(21, 2021)]
    busy = [_event(n, now - 200, "busy") for n in range(2021, 2621)]
    await a.add_events("j1", quiet + noisy + busy)
    async with a._conn() as conn:
        total = (await pg_events.size(conn))[1]
    bound = total // 3
    report = await a.prune_events(max_age_s=None, max_bytes=bound)
    left = {
        tenant: {e.call_id for e in (await a.events_page(tenant=tenant, limit=10_000)).events}
        for tenant in ("quiet", "noisy", "busy")
    }
    assert left["quiet"] == {f"c{n}" for n in range(1, 21)}
    assert "c21" not in left["noisy"] and "c2020" in left["noisy"]
    assert "c2021" not in left["busy"] and "c2620" in left["busy"]
    assert abs(len(left["noisy"]) - len(left["busy"])) <= 1  # rows of one size: the same level
    async with a._conn() as conn:
        rows, after = await pg_events.size(conn)
    assert 0 < after <= bound and rows == sum(len(ids) for ids in left.values()), (rows, after, bound)
    assert report.deleted == 2620 - rows


async def test_a_size_prune_whose_first_pass_falls_short_goes_on(
    stores: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows shipped while a size prune runs leave its first pass short of the bound (made to happen
    here: the first pass frees half of what it should); the next pass, weighing the table again,
    ends within the bound."""
    a, _ = stores
    now = time.time()
    await a.add_events("j1", [_event(n, now - 60, "acme" if n % 2 else "other") for n in range(1, 1001)])
    from sandbox.journal.fair_share import fair_cuts as real

    calls: list[int] = []

    def short_first(usage: dict[str, int], excess: int) -> dict[str, int]:
        calls.append(excess)
        cuts = real(usage, excess)
        return {t: c // 2 for t, c in cuts.items()} if len(calls) == 1 else cuts

    monkeypatch.setattr(pg_events, "fair_cuts", short_first)
    async with a._conn() as conn:
        bound = (await pg_events.size(conn))[1] // 2
    await a.prune_events(max_age_s=None, max_bytes=bound)
    async with a._conn() as conn:
        assert (await pg_events.size(conn))[1] <= bound
    assert len(calls) >= 2


async def test_an_event_postgresql_cannot_take_as_is_never_stops_the_log(
    stores: tuple[PostgresStore, PostgresStore], tmp_path: Path
) -> None:
    """A tool name with NUL (any 1 to 128 characters reach the journal; PostgreSQL refuses NUL)
    and data of megabytes: shipped (replaced, or as a note of their size), and the events after
    them too."""
    a, _ = stores
    journal = Journal(tmp_path / "a.sqlite3")
    try:
        journal.append(
            trace_id="t1", call_id="c1", session="agent:main:s1", tenant="acme", agent="main",
            tool="x\x00y", stage="invalid", data={"big": ["z" * 100] * 20_000},
        )  # fmt: skip
        _fill(journal, "acme", 3)
        await _ship_until(journal, a, 7, "acme")
        events = (await a.events_page(tenant="acme", limit=100)).events
        odd = next(e for e in events if e.call_id == "c1")
        assert "\x00" not in odd.tool and odd.tool.startswith("x")
        assert odd.data["truncated"] is True and odd.data["bytes"] > 2_000_000
    finally:
        journal.close()


async def test_a_store_that_keeps_refusing_one_event_ships_the_rest(tmp_path: Path) -> None:
    """A batch the store refuses while it answers is shipped event by event; the event it still
    refuses is left out (logged), the others land."""
    from sandbox.errors import ErrorCode, SandboxError

    class Refusing:
        def __init__(self) -> None:
            self.rows: list[int] = []

        async def ping(self) -> None:
            return None

        async def shipped_up_to(self, origin: str) -> int:
            return 0

        async def add_events(self, origin: str, events: list[Event]) -> None:
            if any(e.stage == "poison" for e in events):
                raise SandboxError(ErrorCode.SERVICE_UNAVAILABLE, "refused")
            self.rows += [e.id for e in events]

    journal = Journal(tmp_path / "a.sqlite3")
    store = Refusing()
    try:
        _fill(journal, "acme", 2)
        journal.append(trace_id="t", call_id="p", session="s", tenant="acme", agent="a", tool="x", stage="poison")
        _fill(journal, "acme", 2)
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: ship_journal(journal, store, every_s=0.01))  # type: ignore[arg-type]
            with anyio.fail_after(20):
                while len(store.rows) < 8:
                    await anyio.sleep(0.05)
            group.cancel_scope.cancel()
        assert store.rows == [1, 2, 3, 4, 6, 7, 8, 9]
    finally:
        journal.close()


async def test_one_replica_prunes_at_a_time(stores: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = stores
    async with a._conn() as held:
        await held.execute("SELECT pg_advisory_lock(%s)", (pg_events.PRUNE_LOCK,))
        try:
            report = await b.prune_events(max_age_s=1.0, max_bytes=None)
        finally:
            await held.execute("SELECT pg_advisory_unlock(%s)", (pg_events.PRUNE_LOCK,))
    assert report.skipped and report.deleted == 0


async def test_progress_events_reach_the_other_replicas_bus_once_and_never_come_back(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    from sandbox.api.progress_relay import ProgressRelay
    from sandbox.engine.progress import ProgressBus, ProgressEvent

    buses = ProgressBus(), ProgressBus()
    seen: tuple[list[ProgressEvent], list[ProgressEvent]] = ([], [])
    buses[0].subscribe(seen[0].append)
    buses[1].subscribe(seen[1].append)
    relays = ProgressRelay(buses[0], stores[0]), ProgressRelay(buses[1], stores[1])

    def event(n: int, session: str = "agent:main:s1", **detail: Any) -> ProgressEvent:
        return ProgressEvent("running", f"c{n}", f"t{n}", "exec", session, 0.5, detail)

    async with anyio.create_task_group() as group:
        for relay in relays:
            group.start_soon(relay.run)
        await anyio.sleep(0.5)  # both listening
        for n in range(20):
            buses[0].emit(event(n))
        buses[0].emit(event(99, kind_detail="x", text="z" * 50_000))  # larger than NOTIFY takes
        buses[1].emit(event(100, session="agent:main:s2"))
        with anyio.fail_after(10):
            while len(seen[1]) < 22 or len(seen[0]) < 22:
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)  # anything echoed would be here by now
        group.cancel_scope.cancel()
    remote_on_b = [e for e in seen[1] if e.origin]
    assert [e.call_id for e in remote_on_b] == [f"c{n}" for n in range(20)] + ["c99"]
    assert {e.origin for e in remote_on_b} == {relays[0].origin}
    assert remote_on_b[0].session == "agent:main:s1" and remote_on_b[0].elapsed_s == 0.5
    assert remote_on_b[-1].detail["text"].startswith("z" * 2000)  # an output chunk is cut, not dropped
    assert remote_on_b[-1].detail["text"].endswith("48000 more characters]")
    # nothing went round: A saw its own 21 once and B's one, B its own one and A's 21
    assert len(seen[0]) == 22 and len(seen[1]) == 22
    assert [e.call_id for e in seen[0] if e.origin] == ["c100"]


async def test_a_notification_nobody_expected_never_ends_the_relay(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """Anybody on the database may NOTIFY the progress channel: a list, a deep nest, text, an
    unknown field are each logged and dropped, and the relay goes on relaying."""
    from sandbox.api.progress_relay import ProgressRelay
    from sandbox.engine.progress import ProgressBus, ProgressEvent
    from sandbox.state.postgres.shared_rows import BROADCAST_CHANNEL

    bus = ProgressBus()
    seen: list[ProgressEvent] = []
    bus.subscribe(seen.append)
    relay = ProgressRelay(bus, stores[1])
    async with anyio.create_task_group() as group:
        group.start_soon(relay.run)
        await anyio.sleep(0.5)
        odd = ["[1]", "[" * 3000 + "]" * 3000, "not json", '{"origin": "x", "events": [{"nope": 1}]}', '{"origin": 1}']
        async with stores[0]._conn() as conn:
            for payload in odd:
                await conn.execute("SELECT pg_notify(%s, %s)", (BROADCAST_CHANNEL, payload))
        await stores[0].broadcast(
            ['{"origin": "other", "events": [{"kind": "running", "call_id": "c1", "trace_id": "t", "tool": "exec", '
             '"session": "agent:main:s1", "elapsed_s": 1.0, "detail": {}}]}']
        )  # fmt: skip
        with anyio.fail_after(10):
            while not seen:
                await anyio.sleep(0.02)
        group.cancel_scope.cancel()
    assert [(e.call_id, e.origin) for e in seen] == [("c1", "other")]
