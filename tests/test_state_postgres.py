"""What only the PostgreSQL store has: its listening connection and its pool survive the server
ending their sessions (a failover, an operator's pg_terminate_backend), and a failure meanwhile
is a SandboxError, never a driver exception."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import anyio
import psycopg
import pytest

from sandbox.config.state import parse_state_url
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.approvals import Approval
from sandbox.state import QuotaLimits, Reservation, open_store
from sandbox.state.admin import migrate_store
from sandbox.state.protocol import EventStore, SharedLoops
from tests.pg_server import create_database, start_server

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


def _terminate_others(pg_url: str, application: str = "agent-sandbox") -> int:
    """End every session of the store's database but this one (a real fault, not a mock)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = %s",
            (application,),
        ).fetchall()
    return len(rows)


async def test_a_waiter_is_woken_after_its_listening_connection_was_killed(pg_url: str, tmp_path: object) -> None:
    """The LISTEN connection is ended by the server; the store listens again and a later decision
    still wakes the waiter (no polling to fall back on)."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)  # type: ignore[arg-type]
    async with open_store(url, tmp_path, owner="a") as a, open_store(url, tmp_path, owner="b") as b:  # type: ignore[arg-type]
        approval = Approval("a-1", "c", "t", "agent:main:s", "main", "exec", {}, "pending", "", time.time(), None)
        await a.add_approval(approval)
        got: list[Approval | None] = []

        async def wait() -> None:
            got.append(await a.wait_decided("a-1", 60))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.3)
            assert _terminate_others(pg_url) >= 2  # both stores' listeners and pooled connections
            await anyio.sleep(1.5)  # the listener reconnects (1 s back-off); the contract holds either way
            with anyio.fail_after(30):
                while True:  # b's pool may hand out a connection the server ended: an error, then a fresh one
                    try:
                        await b.decide("a-1", "approved", "after the outage")
                        break
                    except SandboxError as exc:
                        assert exc.code == ErrorCode.SERVICE_UNAVAILABLE
                        await anyio.sleep(0.1)
        assert got and got[0] is not None and got[0].status == "approved"


async def test_a_pooled_connection_the_server_ended_is_a_clear_error_then_replaced(
    pg_url: str, tmp_path: object
) -> None:
    """After the server ends the pool's sessions, a call fails as SERVICE_UNAVAILABLE (or succeeds
    on a fresh connection) and the store works again without being reopened."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)  # type: ignore[arg-type]
    async with open_store(url, tmp_path, owner="a") as store:  # type: ignore[arg-type]
        await store.ping()
        _terminate_others(pg_url)
        outcomes: list[str] = []
        with anyio.fail_after(30):
            while not outcomes or outcomes[-1] != "ok":
                try:
                    await store.ping()
                    outcomes.append("ok")
                except SandboxError as exc:
                    assert exc.code == ErrorCode.SERVICE_UNAVAILABLE and "cannot be used" in exc.message
                    outcomes.append("error")
        assert outcomes[-1] == "ok" and set(outcomes) <= {"ok", "error"}


async def test_a_release_the_server_missed_is_given_back_once_it_returns(tmp_path: Path) -> None:
    """The server stops while a call holds a slot: the release fails with SERVICE_UNAVAILABLE;
    when the server is back the store gives the slot back by itself (the replica is alive, so no
    lease would ever free it). A server of this test's own, since it is stopped and started."""
    server = start_server()
    try:
        pg_url = create_database(server)
        url = parse_state_url(pg_url)
        await migrate_store(url, tmp_path)
        async with open_store(url, tmp_path, owner="replica", lease_s=1.5) as store:
            held = await store.reserve("t1", QuotaLimits(max_concurrent_calls=1))
            assert isinstance(held, Reservation)
            await anyio.to_thread.run_sync(server.stop)
            with pytest.raises(SandboxError) as info:
                await store.release(held)
            assert info.value.code == ErrorCode.SERVICE_UNAVAILABLE
            await anyio.to_thread.run_sync(server.start)
            with anyio.fail_after(60):  # renewals every 0.5 s; this bounds a broken store only
                while _held(pg_url):
                    await anyio.sleep(0.2)
            assert isinstance(await store.reserve("t1", QuotaLimits(max_concurrent_calls=1)), Reservation)
    finally:
        server.stop()


def _held(pg_url: str) -> int:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT count(*) FROM reservations").fetchone()
    return int(row[0]) if row else 0


async def test_a_sandbox_make_and_a_session_close_the_server_missed_land_once_it_returns(tmp_path: Path) -> None:
    """The server stops while a call holds a sandbox make and a session is open: the make's
    release and the session's close fail with SERVICE_UNAVAILABLE; once the server is back, the
    store lands both by itself (a live replica's lease would never free them)."""

    async def empty() -> set[str]:
        return set()

    server = start_server()
    try:
        pg_url = create_database(server)
        url = parse_state_url(pg_url)
        await migrate_store(url, tmp_path)
        async with open_store(url, tmp_path, owner="replica", lease_s=1.5) as store:
            shared: Any = store
            make = await shared.take_sandbox("t1", "box", 1, empty)
            assert isinstance(make, str)
            opened = await store.reserve("t1", QuotaLimits(max_sessions=1), session="s1")
            assert isinstance(opened, Reservation) and await store.confirm_session(opened, 1)
            await anyio.to_thread.run_sync(server.stop)
            for give_back in (lambda: shared.release_sandbox(make), lambda: store.close_sessions("t1", ["s1"])):
                with pytest.raises(SandboxError) as info:
                    await give_back()
                assert info.value.code == ErrorCode.SERVICE_UNAVAILABLE
            await anyio.to_thread.run_sync(server.start)
            with anyio.fail_after(60):  # renewals every 0.5 s; this bounds a broken store only
                while _count(pg_url, "sbx_sandbox_makes") or _count(pg_url, "sbx_tenant_sessions"):
                    await anyio.sleep(0.2)
            assert isinstance(await shared.take_sandbox("t1", "other", 1, empty), str)
            assert isinstance(await store.reserve("t1", QuotaLimits(max_sessions=1), session="s2"), Reservation)
    finally:
        server.stop()


def _count(pg_url: str, table: str) -> int:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


async def test_the_shared_registry_forgets_old_messages_and_closed_lineage(pg_url: str, tmp_path: Path) -> None:
    """As the state dir's registry does (tests/test_sessions.py): what is older than the
    retention goes from the shared tables; an open session's lineage stays whatever its age."""
    from sandbox.sessions.registry import Child
    from sandbox.sessions.shared_registry import SharedRegistry
    from sandbox.state.postgres.registry import PgRegistry

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    registry = SharedRegistry(PgRegistry(url))
    try:
        for name in ("closed", "open"):
            child = Child(
                f"agent:a:subagent:{name}", "t", "a", "agent:a:main", 1, name, "task", None, "none", "", "c1",
                time.time(), "open", None,
            )  # fmt: skip
            registry.add_child(child, max_children=5)
            registry.send("t", child.key, "agent:a:main", "hello")
        registry.mark_closed("agent:a:subagent:closed")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE sbx_inbox SET created_at = created_at - 86400")
            conn.execute("UPDATE sbx_lineage SET created_at = created_at - 86400, closed_at = closed_at - 86400")
        registry.send("t", "agent:a:subagent:open", "agent:a:main", "recent")
        assert registry.prune(time.time() - 3600) == 3
        assert registry.child("agent:a:subagent:closed") is None
        assert registry.child("agent:a:subagent:open") is not None
        assert [m.text for m in registry.messages("t", "agent:a:subagent:open")] == ["recent"]
    finally:
        registry.close()


async def test_a_replica_whose_clock_runs_ahead_keeps_the_registrys_recent_rows(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's cutoff is moved to the server's clock: a replica two hours ahead, pruning
    with a one-hour retention on its own clock, keeps a message of the last minute and the
    lineage of a session closed a minute ago; a day-old message still goes."""
    from sandbox.sessions import shared_registry
    from sandbox.sessions.registry import Child
    from sandbox.sessions.shared_registry import SharedRegistry
    from sandbox.state.postgres.registry import PgRegistry

    class ClockAhead:
        @staticmethod
        def time() -> float:
            return time.time() + 7200

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    registry = SharedRegistry(PgRegistry(url))
    try:
        child = Child(
            "agent:a:subagent:skew", "t", "a", "agent:a:main", 1, "skew", "task", None, "none", "", "c1",
            time.time(), "open", None,
        )  # fmt: skip
        registry.add_child(child, max_children=5)
        registry.send("t", child.key, "agent:a:main", "old")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE sbx_inbox SET created_at = created_at - 86400")
        registry.send("t", child.key, "agent:a:main", "recent")
        registry.mark_closed(child.key)
        monkeypatch.setattr(shared_registry, "time", ClockAhead)
        assert registry.prune(ClockAhead.time() - 3600) == 1
        assert [m.text for m in registry.messages("t", child.key)] == ["recent"]
        assert registry.child(child.key) is not None
    finally:
        registry.close()


async def test_the_shared_registry_prunes_in_batches_by_the_time_indexes(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every replica's registry is pruned in short transactions of PRUNE_BATCH rows, found
    through the time indexes (step 0014), not by one DELETE scanning every message."""
    from sandbox.sessions import shared_registry
    from sandbox.sessions.shared_registry import SharedRegistry
    from sandbox.state.postgres.registry import PgRegistry

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    monkeypatch.setattr(shared_registry, "PRUNE_BATCH", 2)
    registry = SharedRegistry(PgRegistry(url))
    try:
        for i in range(5):
            registry.send("t", "agent:a:batched", "agent:a:main", f"m{i}")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE sbx_inbox SET created_at = created_at - 86400 WHERE session = 'agent:a:batched'")
            conn.execute("SET enable_seqscan = off")  # the table is small: is the index there to use?
            for sql, index in ((shared_registry.PRUNE_INBOX, "sbx_inbox_created"),
                               (shared_registry.PRUNE_LINEAGE, "sbx_lineage_closed")):  # fmt: skip
                plan = " ".join(str(r[0]) for r in conn.execute("EXPLAIN " + sql, (0.0, 1)).fetchall())
                assert index in plan, plan
        statements: list[str] = []
        real = registry._rows.rows

        def traced(sql: str, args: Any) -> list[tuple[Any, ...]]:
            statements.append(sql)
            return real(sql, args)

        monkeypatch.setattr(registry._rows, "rows", traced)
        assert registry.prune(time.time() - 3600) == 5
        assert statements.count(shared_registry.PRUNE_INBOX) == 3  # 2 + 2 + 1
        assert registry.messages("t", "agent:a:batched") == []
    finally:
        registry.close()


async def test_decided_approvals_older_than_the_retention_go_from_the_store(pg_url: str, tmp_path: Path) -> None:
    """Each approval holds its call's whole arguments (up to twice max_write_bytes): decided
    ones older than journal.retention.max_age go with the shared events; pending ones stay."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    async with open_store(url, tmp_path, owner="a") as store:
        for n, status in enumerate(("old-decided", "old-pending", "new-decided")):
            approval = Approval(status, f"c{n}", "t", "agent:main:s", "main", "write", {"content": "x" * 1000},
                                "pending", "", time.time(), None)  # fmt: skip
            await store.add_approval(approval)
            if status.endswith("decided"):
                await store.decide(status, "denied", "no")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE approvals SET created = created - 86400, decided = decided - 86400 WHERE id LIKE 'old-%'"
            )
        shipped = cast(EventStore, store)  # the PostgreSQL store ships events (and prunes them)
        report = await shipped.prune_events(max_age_s=3600, max_bytes=None)
        assert not report.skipped
        assert await store.approval("old-decided") is None
        assert await store.approval("old-pending") is not None  # a call still waits on it
        assert await store.approval("new-decided") is not None


async def test_loop_breakers_older_than_the_retention_go_from_the_store(pg_url: str, tmp_path: Path) -> None:
    """One breaker row per tripped session was kept for good: ones tripped (or reset) longer ago
    than journal.retention.max_age go with the shared events, their sessions run again; one
    tripped since stays tripped."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    async with open_store(url, tmp_path, owner="a") as opened:
        store = cast(SharedLoops, opened)  # the PostgreSQL store shares loop history
        await store.loop_trip("t", "agent:a:old")
        await store.loop_reset("t", "agent:a:reset")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE sbx_loop_sessions SET ts = ts - 86400")
        await store.loop_trip("t", "agent:a:new")
        report = await cast(EventStore, opened).prune_events(max_age_s=3600, max_bytes=None)
        assert not report.skipped
        assert not (await store.loop_recent("t", "agent:a:old", 10))[0]
        assert (await store.loop_recent("t", "agent:a:new", 10))[0]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            left = conn.execute("SELECT session FROM sbx_loop_sessions ORDER BY session").fetchall()
        assert left == [("agent:a:new",)]
