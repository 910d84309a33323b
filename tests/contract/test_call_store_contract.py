"""One contract over call records (the CallStore of sandbox/state/protocol.py), run against the
journal (the embedded default) and PostgreSQL (the store several replicas share): a key is
claimed once, however many ask at once through however many instances; its holder is kept while
the key lives and replaced after; a record's end wakes a waiter on another instance at once."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from sandbox.config.state import parse_state_url
from sandbox.journal.calls import CallRecord, JournalCalls
from sandbox.journal.store import Journal
from sandbox.state import open_store
from sandbox.state.admin import migrate_store
from sandbox.state.protocol import CallStore

pytestmark = pytest.mark.anyio
KINDS = ["journal", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=KINDS)
async def two(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[CallStore, CallStore]]:
    """Two instances on one backing, as two processes (or replicas) hold them."""
    async with AsyncExitStack() as stack:
        if request.param == "journal":
            path = tmp_path / "journal.sqlite3"
            journals = [Journal(path), Journal(path)]
            for journal in journals:
                stack.callback(journal.close)
            yield JournalCalls(journals[0]), JournalCalls(journals[1])
            return
        url = parse_state_url(request.getfixturevalue("pg_url"))
        await migrate_store(url, tmp_path)
        a = await stack.enter_async_context(open_store(url, tmp_path, owner="a@elsewhere|boot|1|1"))
        b = await stack.enter_async_context(open_store(url, tmp_path, owner="b@elsewhere|boot|1|1"))
        yield a, b  # type: ignore[misc]  # PostgresStore is a CallStore


def _record(call_id: str, key: str | None = "k", tenant: str = "acme", fingerprint: str = "f1") -> CallRecord:
    return CallRecord(
        call_id=call_id,
        tenant=tenant,
        session="agent:main:s1",
        agent="main",
        tool="exec",
        idempotency_key=key,
        fingerprint=fingerprint,
        state="running",
        result=None,
        reason="",
        created=time.time(),
        ended=None,
    )


async def test_of_many_claims_of_one_key_through_two_instances_one_wins(two: tuple[CallStore, CallStore]) -> None:
    won: list[str] = []

    async def claim(store: CallStore, n: int) -> None:
        held = await store.claim_call(_record(f"c_{n}"), keep_s=3600)
        won.append(held.call_id)

    async with anyio.create_task_group() as group:
        for n in range(12):
            group.start_soon(claim, two[n % 2], n)
    assert len(set(won)) == 1 and len(won) == 12


async def test_a_key_is_per_tenant_and_an_unkeyed_call_always_wins(two: tuple[CallStore, CallStore]) -> None:
    a, b = two
    assert (await a.claim_call(_record("c_a", tenant="acme"), keep_s=3600)).call_id == "c_a"
    assert (await b.claim_call(_record("c_b", tenant="globex"), keep_s=3600)).call_id == "c_b"
    assert (await b.claim_call(_record("c_c", tenant="acme"), keep_s=3600)).call_id == "c_a"
    for n in range(3):
        assert (await a.claim_call(_record(f"c_u{n}", key=None), keep_s=3600)).call_id == f"c_u{n}"


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_the_end_is_recorded_and_wakes_a_waiter_on_the_other_instance(two: tuple[CallStore, CallStore]) -> None:
    a, b = two
    await a.claim_call(_record("c_w"), keep_s=3600)
    waited: list[Any] = []

    async def wait() -> None:
        started = time.monotonic()
        waited.append(await b.wait_call("c_w", 30))
        waited.append(time.monotonic() - started)

    async with anyio.create_task_group() as group:
        group.start_soon(wait)
        await anyio.sleep(0.3)
        await a.set_call_state("c_w", "awaiting_approval")
        await a.end_call("c_w", "finished", '{"ok": true}')
    found, took = waited
    assert found.state == "finished" and found.result == '{"ok": true}' and found.ended is not None
    assert took < 5  # woken, not timed out
    await a.set_call_state("c_w", "running")  # never over an ended call
    assert (await b.call_record("c_w")).state == "finished"
    assert await b.call_record("c_none") is None
    assert (await b.wait_call("c_none", 0.1)) is None


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_an_expired_key_is_claimed_anew_and_a_live_one_is_kept(two: tuple[CallStore, CallStore]) -> None:
    a, b = two
    await a.claim_call(_record("c_old"), keep_s=3600)
    await a.end_call("c_old", "abandoned", None, "cancelled by the test")
    assert (await b.claim_call(_record("c_new"), keep_s=3600)).call_id == "c_old"  # still kept
    await anyio.sleep(1.1)
    assert (await b.claim_call(_record("c_new"), keep_s=1)).call_id == "c_new"  # its lifetime is over
    assert await a.call_record("c_old") is None  # gone with its key


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_waiter_that_times_out_gets_the_record_as_it_is(two: tuple[CallStore, CallStore]) -> None:
    a, b = two
    await a.claim_call(_record("c_slow"), keep_s=3600)
    found = await b.wait_call("c_slow", 0.3)
    assert found is not None and found.state == "running"


@pytest.mark.postgres
async def test_a_call_whose_replica_is_gone_is_abandoned_not_waited_for(pg_url: str, tmp_path: Path) -> None:
    """A replica records a keyed call and goes away without ending it (its lease dropped, as a
    crash lets it lapse): a repeat of the key through another replica finds it abandoned, and a
    waiter returns at once, instead of waiting for a run that is gone."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    async with open_store(url, tmp_path, owner="gone@elsewhere|boot|1|1") as gone:
        assert (await gone.claim_call(_record("c_orphan"), keep_s=3600)).call_id == "c_orphan"  # type: ignore[attr-defined]
    async with open_store(url, tmp_path, owner="alive@elsewhere|boot|1|1") as alive:
        held = await alive.claim_call(_record("c_retry"), keep_s=3600)  # type: ignore[attr-defined]
        assert held.call_id == "c_orphan" and held.state == "abandoned" and "went away" in held.reason
        started = time.monotonic()
        found = await alive.wait_call("c_orphan", 30)  # type: ignore[attr-defined]
        assert found.state == "abandoned" and time.monotonic() - started < 5


@pytest.mark.postgres
async def test_a_gone_replicas_durable_record_is_an_orphan_one_replica_adopts(pg_url: str, tmp_path: Path) -> None:
    """A replica whose lease ran out leaves its running records: a durable one is neither ended
    by a waiter nor by a repeat of its key; it is listed as an orphan, with its note, and of two
    replicas adopting it at once exactly one gets it."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    async with open_store(url, tmp_path, owner="gone@elsewhere|boot|1|1", lease_s=1) as gone:
        await gone.claim_call(_record("c_durable", key="d"), keep_s=3600)  # type: ignore[attr-defined]
        await gone.claim_call(_record("c_plain", key="p"), keep_s=3600)  # type: ignore[attr-defined]
        await gone.note_durable("c_durable", {"process_id": "p_1", "timeout_s": 30})  # type: ignore[attr-defined]
    await anyio.sleep(1.5)  # its lease has run out (closing dropped it too)
    async with (
        open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as a,
        open_store(url, tmp_path, owner="b@elsewhere|boot|1|1") as b,
    ):
        for up in (a, b):  # replicas up for a while (renewing without a miss): they trust a lease run out
            up._steady_since -= 3600  # type: ignore[attr-defined]
        waited = await a.wait_call("c_durable", 0.5)  # type: ignore[attr-defined]
        assert waited is not None and waited.state == "running"  # left for adoption, not ended
        assert (await a.wait_call("c_plain", 0.5)).state == "abandoned"  # type: ignore[attr-defined]
        orphans = {r.call_id: note for r, note in await a.orphans()}  # type: ignore[attr-defined]
        await b.orphans()  # type: ignore[attr-defined]
        assert orphans == {"c_durable": {"process_id": "p_1", "timeout_s": 30}}
        won = [await a.adopt_call("c_durable"), await b.adopt_call("c_durable")]  # type: ignore[attr-defined]
        assert sorted(won) == [False, True]
        assert await a.orphans() == [] and await b.orphans() == []  # type: ignore[attr-defined]


@pytest.mark.postgres
async def test_an_unkeyed_call_is_recorded_while_it_runs_and_a_gone_replicas_is_an_orphan(
    pg_url: str, tmp_path: Path
) -> None:
    """The shared store records an unkeyed call only while it runs: untracked by its owner it
    is gone (no result kept); a gone replica's running one is an orphan (no note: it is settled,
    not adopted), which one replica takes; untracking by anyone but the owner removes nothing."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    async with open_store(url, tmp_path, owner="gone@elsewhere|boot|1|1", lease_s=1) as gone:
        await gone.track_call(_record("u_done", key=None))  # type: ignore[attr-defined]
        await gone.track_call(_record("u_left", key=None))  # type: ignore[attr-defined]
        assert (await gone.call_record("u_done")).state == "running"  # type: ignore[attr-defined]
        await gone.untrack_call("u_done")  # type: ignore[attr-defined]
        assert await gone.call_record("u_done") is None  # type: ignore[attr-defined]
    await anyio.sleep(1.5)  # its lease has run out (closing dropped it too)
    async with (
        open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as a,
        open_store(url, tmp_path, owner="b@elsewhere|boot|1|1") as b,
    ):
        for up in (a, b):  # replicas up for a while (renewing without a miss): they trust a lease run out
            up._steady_since -= 3600  # type: ignore[attr-defined]
        await a.untrack_call("u_left")  # type: ignore[attr-defined]  # not a's: stays
        assert (await a.call_record("u_left")).state == "running"  # type: ignore[attr-defined]
        orphans = {r.call_id: note for r, note in await a.orphans()}  # type: ignore[attr-defined]
        await b.orphans()  # type: ignore[attr-defined]
        assert orphans == {"u_left": None}
        won = [await a.adopt_call("u_left"), await b.adopt_call("u_left")]  # type: ignore[attr-defined]
        assert sorted(won) == [False, True]


@pytest.mark.postgres
async def test_two_replicas_never_give_one_session_uid_to_two_sessions(pg_url: str, tmp_path: Path) -> None:
    """Session uids of a shared container from the store: two replicas allocating for many
    sessions at once (half of them the same sessions) give each session one uid and one record
    token wherever it is asked, and never one uid to two sessions."""
    from types import SimpleNamespace

    from sandbox.runtime.session_users import SharedUids, allocate_shared

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    spec = SimpleNamespace(tenant="acme", scope_key="agent:alpha", user="1000:1000")
    got: dict[tuple[int, str], tuple[int, str]] = {}
    async with (
        open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as a,
        open_store(url, tmp_path, owner="b@elsewhere|boot|1|1") as b,
    ):

        async def ask(n: int, store: Any, session: str) -> None:
            user = await allocate_shared(store, spec, session)
            got[(n, session)] = (user.uid, user.token)

        async with anyio.create_task_group() as group:
            for n, store in enumerate((a, b)):
                for i in range(60):
                    group.start_soon(ask, n, store, f"agent:alpha:s{i}" if i < 30 else f"agent:alpha:r{n}-{i}")
        by_session: dict[str, set[tuple[int, str]]] = {}
        for (_, session), held in got.items():
            by_session.setdefault(session, set()).add(held)
        assert all(len(held) == 1 for held in by_session.values())  # one uid and token a session
        uids = [next(iter(held))[0] for held in by_session.values()]
        assert len(uids) == len(set(uids)) == 90  # never one uid for two sessions
        cached = SharedUids(a)  # type: ignore[arg-type]
        first = await cached.user(spec, "agent:alpha:s3")
        assert (first.uid, first.token) == next(iter(by_session["agent:alpha:s3"])) and first.gid == 1000


@pytest.mark.postgres
async def test_a_pool_member_is_claimed_by_one_replica(pg_url: str, tmp_path: Path) -> None:
    """Replicas on one engine claim warm-pool members in the store: of sixteen claims of one
    container through two instances at once, one wins; another container is free."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    won: list[bool] = []
    async with (
        open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as a,
        open_store(url, tmp_path, owner="b@elsewhere|boot|1|1") as b,
    ):

        async def claim(store: Any, n: int) -> None:
            won.append(await store.claim_member("c0ffee", f"agent:alpha:s{n}"))

        async with anyio.create_task_group() as group:
            for n in range(16):
                group.start_soon(claim, (a, b)[n % 2], n)
        assert sorted(won) == [False] * 15 + [True]
        assert await b.claim_member("decade", "agent:alpha:s99") is True  # type: ignore[attr-defined]


@pytest.mark.postgres
async def test_a_sessions_process_table_is_one_through_every_replica(pg_url: str, tmp_path: Path) -> None:
    """A process recorded through one store instance is read, updated and forgotten through
    another; another session (or tenant) of the same name sees none of it."""
    from sandbox.tools.process_table import SharedProcessTable

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    async with (
        open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as a,
        open_store(url, tmp_path, owner="b@elsewhere|boot|1|1") as b,
    ):
        on_a = SharedProcessTable(a, "acme", "agent:alpha:s1")  # type: ignore[arg-type]
        on_b = SharedProcessTable(b, "acme", "agent:alpha:s1")  # type: ignore[arg-type]
        await on_a.put("p_1", {"command": "sleep 1", "offset": 0})
        assert await on_b.all() == {"p_1": {"command": "sleep 1", "offset": 0}}
        await on_b.put("p_1", {"command": "sleep 1", "offset": 12})
        assert await on_a.get("p_1") == {"command": "sleep 1", "offset": 12}
        assert await SharedProcessTable(b, "globex", "agent:alpha:s1").all() == {}  # type: ignore[arg-type]
        assert await SharedProcessTable(b, "acme", "agent:alpha:s2").get("p_1") is None  # type: ignore[arg-type]
        await on_b.put("p_1", None)
        assert await on_a.all() == {}


@pytest.mark.postgres
async def test_after_an_outage_a_lease_run_out_is_trusted_only_once_this_store_renewed_a_whole_lease(
    pg_url: str, tmp_path: Path
) -> None:
    """After an outage of the store every lease looks run out: a replica that has just come
    back takes no other replica's call for gone until it has itself renewed for a whole lease
    (the others get that long to renew theirs). Pages of records it cannot settle never hide
    the ones after them."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO owners VALUES ('far@elsewhere|b|1|1', 0)")  # its lease ran out long ago
        for n in range(130):
            conn.execute(
                "INSERT INTO calls (call_id, tenant, session, agent, tool, fingerprint, state, created, owner) "
                "VALUES (%s, 't', 's', 'a', 'exec', '', 'running', %s, 'far@elsewhere|b|1|1')",
                (f"u{n:03d}", 1000.0 + n),
            )
    async with open_store(url, tmp_path, owner="b@elsewhere|boot|1|1", lease_s=2) as b:
        b._steady_since = time.monotonic()  # type: ignore[attr-defined]  # it has just come back
        assert await b.orphans() == []  # type: ignore[attr-defined]
        await anyio.sleep(2.2)
        found = await b.orphans()  # type: ignore[attr-defined]
        assert len(found) == 130 and found[-1][0].call_id == "u129"  # past the first page


@pytest.mark.postgres
async def test_a_locked_store_fails_a_call_record_instead_of_hanging_it(pg_url: str, tmp_path: Path) -> None:
    """Every statement of the store's pool has a lock timeout: a table held locked (a migration's
    DDL, a VACUUM FULL) makes a call's record fail with SERVICE_UNAVAILABLE, not wait forever."""
    from sandbox.errors import ErrorCode, SandboxError

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    async with open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as a:
        with psycopg.connect(pg_url) as holder:
            holder.execute("LOCK TABLE calls IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(SandboxError) as failed:
                await a.track_call(_record("u_locked", key=None))  # type: ignore[attr-defined]
            assert failed.value.code == ErrorCode.SERVICE_UNAVAILABLE
            assert time.monotonic() - started < 30
            holder.rollback()


@pytest.mark.postgres
async def test_a_lost_pool_claim_gives_way_and_a_forgotten_process_stays_forgotten(pg_url: str, tmp_path: Path) -> None:
    """A pool claim ten minutes old whose member was never handed over (its replica died) gives
    way to a new claim; a poll's write-back never makes a process another replica forgot again."""
    from sandbox.tools.process_table import SharedProcessTable

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    async with open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as a:
        assert await a.claim_member("c1", "agent:alpha:s1") is True  # type: ignore[attr-defined]
        assert await a.claim_member("c1", "agent:alpha:s2") is False  # type: ignore[attr-defined]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE sbx_pool_claims SET at = at - 601 WHERE container_id = 'c1'")
        assert await a.claim_member("c1", "agent:alpha:s2") is True  # type: ignore[attr-defined]
        table = SharedProcessTable(a, "acme", "agent:alpha:s1")  # type: ignore[arg-type]
        await table.put("p_1", {"offset": 0})
        await table.put("p_1", None)  # forgotten through another replica
        await table.update("p_1", {"offset": 5})  # a poll that read it before
        assert await table.get("p_1") is None


@pytest.mark.postgres
async def test_a_waiter_just_after_an_outage_ends_no_call_whose_lease_only_looks_run_out(
    pg_url: str, tmp_path: Path
) -> None:
    """A keyed call whose replica's lease ran out (not dropped: that replica may be renewing
    it right now, after an outage of the store) is not ended by a waiter of a store that has
    just come back; once that store has renewed for a whole lease, it is."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO owners VALUES ('far@elsewhere|b|1|1', 0)")
        conn.execute(
            "INSERT INTO calls (call_id, tenant, session, agent, tool, idem_key, fingerprint, state, created, owner) "
            "VALUES ('c_far', 'acme', 's', 'a', 'exec', 'k', 'f', 'running', %s, 'far@elsewhere|b|1|1')",
            (time.time(),),
        )
    async with open_store(url, tmp_path, owner="b@elsewhere|boot|1|1") as b:
        assert (await b.wait_call("c_far", 0.3)).state == "running"  # type: ignore[attr-defined]
        b._steady_since -= 3600  # type: ignore[attr-defined]  # renewed without a miss for long now
        assert (await b.wait_call("c_far", 5)).state == "abandoned"  # type: ignore[attr-defined]


@pytest.mark.postgres
async def test_sandboxes_made_at_once_through_two_replicas_never_pass_max_sandboxes(
    pg_url: str, tmp_path: Path
) -> None:
    """Six new sandboxes asked for at once through two store instances under a limit of 1, each
    request listing a slow engine inside the tenant's turn: one make is granted. A made sandbox
    the engine lists counts like a make still running; a killed owner's make stops counting."""
    from sandbox.state.protocol import Refused

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    engine: set[str] = set()  # the tenant's live sandboxes, as the engine would list them

    async def listed() -> set[str]:
        await anyio.sleep(0.1)  # an engine call: the other requests wait for the tenant's turn
        return set(engine)

    async with (
        open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as a,
        open_store(url, tmp_path, owner="b@elsewhere|boot|1|1") as b,
    ):
        outcomes: dict[str, Any] = {}

        async def ask(store: Any, n: int) -> None:
            outcomes[f"s{n}"] = await store.take_sandbox("acme", f"s{n}", 1, listed)

        async with anyio.create_task_group() as group:
            for n in range(6):
                group.start_soon(ask, (a, b)[n % 2], n)
        granted = [k for k, v in outcomes.items() if isinstance(v, str)]
        assert len(granted) == 1, outcomes
        assert all(v.quota == "max_sandboxes" and v.held >= 1 for v in outcomes.values() if isinstance(v, Refused))
        engine.add(granted[0])  # its sandbox exists, and its call ended
        await a.release_sandbox(outcomes[granted[0]])  # type: ignore[attr-defined]
        assert await b.take_sandbox("acme", granted[0], 1, listed) is None  # type: ignore[attr-defined]
        refused = await b.take_sandbox("acme", "s9", 1, listed)  # type: ignore[attr-defined]
        assert isinstance(refused, Refused) and refused.held == 1
        engine.clear()
        assert isinstance(await a.take_sandbox("globex", "g1", 1, listed), str)  # type: ignore[attr-defined]
        with psycopg.connect(pg_url, autocommit=True) as conn:  # a's lease runs out (a replica killed)
            conn.execute("UPDATE owners SET lease_until = 0 WHERE owner = %s", (a.owner,))
        again = await b.take_sandbox("globex", "g2", 1, listed)  # type: ignore[attr-defined]
        assert isinstance(again, str), again  # the dead owner's make stopped counting


@pytest.mark.postgres
async def test_a_make_released_while_another_replica_lists_the_engine_is_still_counted(
    pg_url: str, tmp_path: Path
) -> None:
    """B records its make and starts listing the engine; meanwhile A's call makes its sandbox
    and releases its make, after B's engine list was read: B still sees A's make (read before
    its list), so under a limit of 1 it refuses."""
    from sandbox.state.protocol import Refused

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    engine: set[str] = set()
    async with (
        open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as a,
        open_store(url, tmp_path, owner="b@elsewhere|boot|1|1") as b,
    ):

        async def listed_now() -> set[str]:
            return set(engine)

        first = await a.take_sandbox("acme", "box-a", 1, listed_now)  # type: ignore[attr-defined]
        assert isinstance(first, str)

        async def listed_before_a_finishes() -> set[str]:
            snapshot = set(engine)  # the list B reads: from before A's sandbox exists
            engine.add("box-a")  # then A's call makes its sandbox and ends
            await a.release_sandbox(first)  # type: ignore[attr-defined]
            return snapshot

        outcome = await b.take_sandbox("acme", "box-b", 1, listed_before_a_finishes)  # type: ignore[attr-defined]
        assert isinstance(outcome, Refused) and outcome.held == 1, outcome


@pytest.mark.postgres
async def test_one_tenants_slow_engine_list_holds_no_lock_of_anyone_else(pg_url: str, tmp_path: Path) -> None:
    """While tenant noisy's new-sandbox check waits for a stalled engine list, another tenant's
    reservation and sandbox check, the same tenant's reservation and the lease renewal all
    finish through the same store instance (nothing is locked across the engine call)."""
    from sandbox.state import QuotaLimits, Reservation

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    stalled, release = anyio.Event(), anyio.Event()

    async def stalled_list() -> set[str]:
        stalled.set()
        await release.wait()
        return set()

    async def empty() -> set[str]:
        return set()

    async with open_store(url, tmp_path, owner="a@elsewhere|boot|1|1") as store:
        shared: Any = store
        done: list[str] = []
        async with anyio.create_task_group() as group:

            async def noisy() -> None:
                assert isinstance(await shared.take_sandbox("noisy", "n1", 5, stalled_list), str)
                done.append("noisy")

            group.start_soon(noisy)
            await stalled.wait()
            with anyio.fail_after(30):  # a bound for a broken store only; each takes milliseconds
                assert isinstance(await store.reserve("quiet", QuotaLimits(max_concurrent_calls=1)), Reservation)
                assert isinstance(await shared.take_sandbox("quiet", "q1", 1, empty), str)
                assert isinstance(await store.reserve("noisy", QuotaLimits(max_concurrent_calls=1)), Reservation)
                await store.renew_lease()
                done.append("others")
            release.set()
        assert done == ["others", "noisy"]
