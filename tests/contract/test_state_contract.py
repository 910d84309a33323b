"""One contract over the state store protocol, run against both implementations: SQLite (a file
in a temp state dir) and PostgreSQL (a fresh database on the tests' private server).

What Admission and the approval gate may rely on whichever store holds the state: quotas
reserved in one transaction (a burst split across two store instances, or two processes, never
admits more than the limit), released on call end, a killed owner's reservations expiring with
its lease; approvals decided exactly once, a decision through one instance waking a waiter on
another."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from sandbox.config.state import StateUrl, parse_state_url
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.approvals import Approval
from sandbox.state import QuotaLimits, Refused, Reservation, StateStore, open_store
from sandbox.state.admin import migrate_store
from tests.conftest import ROOT

pytestmark = pytest.mark.anyio

KINDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@dataclass
class Backing:
    """Where the stores of one test keep their state: a URL and a state dir."""

    url: StateUrl
    state_dir: Path

    def open(self, owner: str, lease_s: float = 60.0) -> AbstractAsyncContextManager[StateStore]:
        """A store instance on this backing, as `owner` (an owner on no host of ours: lease only)."""
        return open_store(self.url, self.state_dir, owner=f"{owner}@elsewhere|boot|1|1", lease_s=lease_s)


@pytest.fixture(params=KINDS)
async def backing(request: pytest.FixtureRequest, tmp_path: Path) -> Backing:
    """An empty, migrated store of each kind."""
    url = (
        parse_state_url(request.getfixturevalue("pg_url"))
        if request.param == "postgresql"
        else parse_state_url("sqlite:")
    )
    await migrate_store(url, tmp_path)
    return Backing(url, tmp_path)


@asynccontextmanager
async def two(backing: Backing) -> AsyncIterator[tuple[StateStore, StateStore]]:
    """Two store instances on one backing, as two replicas would hold them."""
    async with backing.open("replica-a") as a, backing.open("replica-b") as b:
        yield a, b


def _approval(approval_id: str, arguments: dict[str, object] | None = None) -> Approval:
    return Approval(
        id=approval_id,
        call_id="c-1",
        trace_id="t-1",
        session="agent:main:s1",
        agent="main",
        tool="exec",
        arguments=arguments if arguments is not None else {"command": "ls"},
        status="pending",
        reason="",
        created=time.time(),
        decided=None,
    )


async def test_reservations_within_the_limit_are_admitted_and_the_next_refused(backing: Backing) -> None:
    """Two slots under max_concurrent_calls 2 are taken; a third is refused naming the quota."""
    limits = QuotaLimits(max_concurrent_calls=2)
    async with backing.open("r") as store:
        first = await store.reserve("t1", limits)
        second = await store.reserve("t1", limits)
        third = await store.reserve("t1", limits)
        assert isinstance(first, Reservation) and isinstance(second, Reservation)
        assert third == Refused("max_concurrent_calls", 2, 2, 1)
        assert await store.in_flight("t1") == 2


async def test_release_gives_the_slot_back(backing: Backing) -> None:
    """A call that ends frees its slot for the next one."""
    limits = QuotaLimits(max_concurrent_calls=1)
    async with backing.open("r") as store:
        held = await store.reserve("t1", limits)
        assert isinstance(held, Reservation)
        assert isinstance(await store.reserve("t1", limits), Refused)
        await store.release(held)
        assert await store.in_flight("t1") == 0
        assert isinstance(await store.reserve("t1", limits), Reservation)


async def test_tenants_do_not_share_a_quota(backing: Backing) -> None:
    """One tenant at its limit leaves another's untouched."""
    limits = QuotaLimits(max_concurrent_calls=1)
    async with backing.open("r") as store:
        assert isinstance(await store.reserve("t1", limits), Reservation)
        assert isinstance(await store.reserve("t2", limits), Reservation)
        assert isinstance(await store.reserve("t1", limits), Refused)


async def test_the_rate_window_counts_starts_not_running_calls(backing: Backing) -> None:
    """max_calls_per_minute counts starts in the window: a released call still counts; a refund does not."""
    limits = QuotaLimits(max_calls_per_minute=3)
    async with backing.open("r") as store:
        taken = []
        for _ in range(3):
            r = await store.reserve("t1", limits)
            assert isinstance(r, Reservation)
            taken.append(r)
            await store.release(r)
        refused = await store.reserve("t1", limits)
        assert isinstance(refused, Refused)
        assert (refused.quota, refused.held, refused.limit) == ("max_calls_per_minute", 3, 3)
        assert 1 <= refused.retry_after_s <= 61
        await store.refund(taken[-1])  # refused after it reserved: its start goes back
        assert isinstance(await store.reserve("t1", limits), Reservation)


async def test_a_batch_takes_its_calls_and_slots_at_once(backing: Backing) -> None:
    """A batch of 3 calls over 2 slots takes 3 starts and 2 slots, or nothing."""
    limits = QuotaLimits(max_concurrent_calls=3, max_calls_per_minute=4)
    async with backing.open("r") as store:
        batch = await store.reserve("t1", limits, calls=3, slots=2)
        assert isinstance(batch, Reservation) and (batch.calls, batch.slots) == (3, 2)
        assert await store.in_flight("t1") == 2
        refused = await store.reserve("t1", limits, calls=2, slots=1)
        assert isinstance(refused, Refused) and refused.quota == "max_calls_per_minute"
        assert await store.in_flight("t1") == 2  # nothing of the refused request was taken


async def test_a_burst_across_two_instances_never_passes_the_limit(backing: Backing) -> None:
    """8 concurrent reservations, 4 through each of two instances, under a limit of 2: exactly 2 admitted."""
    limits = QuotaLimits(max_concurrent_calls=2)
    results: list[Reservation | Refused] = []
    async with two(backing) as (a, b):

        async def one(store: StateStore) -> None:
            results.append(await store.reserve("t1", limits))

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, a if i % 2 else b)
        assert sum(isinstance(r, Reservation) for r in results) == 2
        assert await a.in_flight("t1") == await b.in_flight("t1") == 2


def _worker(backing: Backing, limit: int, count: int, lease_s: float) -> subprocess.Popen[str]:
    args = [backing.url.url, str(backing.state_dir), "t1", str(limit), str(count), str(lease_s)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.state_worker", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline()) == {"ready": True}
    return proc


def _go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _result(proc: subprocess.Popen[str]) -> dict[str, int]:
    assert proc.stdout is not None
    return dict(json.loads(proc.stdout.readline()))


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.mark.slow  # two real processes
async def test_a_burst_across_two_processes_never_passes_the_limit(backing: Backing) -> None:
    """Two processes fire 4 reservations each at once under max_concurrent_calls 2: 2 admitted in all."""
    procs = [_worker(backing, 2, 4, 60.0), _worker(backing, 2, 4, 60.0)]
    try:
        for proc in procs:
            _go(proc)
        outcomes = [_result(proc) for proc in procs]
        assert sum(o["admitted"] for o in outcomes) == 2
        assert sum(o["refused"] for o in outcomes) == 6
        async with backing.open("observer") as store:
            assert await store.in_flight("t1") == 2
    finally:
        for proc in procs:
            _end(proc)
    async with backing.open("observer") as store:  # a process that ends cleanly gives back what it held
        assert await store.in_flight("t1") == 0


@pytest.mark.slow  # a real process, killed
async def test_a_killed_owners_reservations_expire_with_its_lease(backing: Backing) -> None:
    """A process killed with SIGKILL holding both slots: refused while its lease holds, admitted after."""
    proc = _worker(backing, 2, 2, 1.0)
    try:
        _go(proc)
        assert _result(proc) == {"admitted": 2, "refused": 0}
        limits = QuotaLimits(max_concurrent_calls=2)
        async with backing.open("survivor") as store:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            outcome: Reservation | Refused = Refused("max_concurrent_calls", 2, 2, 1)
            with anyio.fail_after(30):  # the lease is 1 s; this only bounds a broken store
                while not isinstance(outcome, Reservation):
                    outcome = await store.reserve("t1", limits)
                    if isinstance(outcome, Refused):
                        await anyio.sleep(0.2)
            assert await store.in_flight("t1") == 1
    finally:
        _end(proc)


async def test_closing_a_store_gives_back_what_it_held(backing: Backing) -> None:
    """A replica that stops cleanly frees its slots at once (no lease to wait out)."""
    limits = QuotaLimits(max_concurrent_calls=1)
    async with backing.open("leaving") as store:
        assert isinstance(await store.reserve("t1", limits), Reservation)
    async with backing.open("staying") as store:
        assert isinstance(await store.reserve("t1", limits), Reservation)


async def test_an_approval_is_read_back_raw_or_masked(backing: Backing) -> None:
    """Pending arguments are exact for the approver (raw) and masked otherwise; a decision masks them."""
    secret: dict[str, object] = {"command": "curl -H 'Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123456789' x"}
    async with backing.open("r") as store:
        await store.add_approval(_approval("a-1", secret))
        raw = await store.approval("a-1", raw=True)
        masked = await store.approval("a-1")
        assert raw is not None and raw.arguments == secret and raw.status == "pending"
        assert masked is not None and masked.arguments != secret
        decided = await store.decide("a-1", "approved", "fine")
        assert (decided.status, decided.reason) == ("approved", "fine")
        assert decided.decided is not None and decided.arguments == masked.arguments
        assert [a.id for a in await store.approvals()] == []
        assert [a.id for a in await store.approvals(None)] == ["a-1"]


async def test_arguments_come_back_byte_for_byte(backing: Backing) -> None:
    """What the approver reads raw is exactly what will run: NUL, control characters, any script."""
    odd: dict[str, object] = {"command": "printf 'a\x00b\x1b[2J'; echo \u00e9\U0001f600", "n": 1.5, "z": [None, True]}
    async with backing.open("r") as store:
        await store.add_approval(_approval("a-odd", odd))
        back = await store.approval("a-odd", raw=True)
        assert back is not None and back.arguments == odd and list(back.arguments) == list(odd)
        listed = await store.approvals(raw=True)
        assert [a.arguments for a in listed] == [odd]


async def test_an_approval_is_decided_once(backing: Backing) -> None:
    """A second decision is CONFLICT naming the first; an unknown id is INVALID_ARGUMENTS."""
    async with backing.open("r") as store:
        await store.add_approval(_approval("a-1"))
        await store.decide("a-1", "denied", "no")
        with pytest.raises(SandboxError) as info:
            await store.decide("a-1", "approved")
        assert info.value.code == ErrorCode.CONFLICT and "denied" in info.value.message
        with pytest.raises(SandboxError) as unknown:
            await store.decide("a-404", "approved")
        assert unknown.value.code == ErrorCode.INVALID_ARGUMENTS


async def test_concurrent_decisions_through_two_instances_have_one_winner(backing: Backing) -> None:
    """Eight deciders at once, half through each instance: one decision wins, seven get CONFLICT."""
    outcomes: list[str] = []
    async with two(backing) as (a, b):
        await a.add_approval(_approval("a-1"))

        async def decide(store: StateStore, status: str) -> None:
            try:
                await store.decide("a-1", status)
                outcomes.append(f"won:{status}")
            except SandboxError as exc:
                outcomes.append(exc.code)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(decide, a if i % 2 else b, "approved" if i % 3 else "denied")
        winners = [o for o in outcomes if o.startswith("won:")]
        assert len(winners) == 1 and outcomes.count(ErrorCode.CONFLICT) == 7
        final = await b.approval("a-1")
        assert final is not None and f"won:{final.status}" == winners[0]


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_decision_through_one_instance_wakes_a_waiter_on_another(backing: Backing) -> None:
    """A waits for the approval; B approves it; A's wait returns the decision (PostgreSQL: by NOTIFY)."""
    got: list[Approval | None] = []
    async with two(backing) as (a, b):
        await a.add_approval(_approval("a-1"))

        async def wait() -> None:
            got.append(await a.wait_decided("a-1", 60))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.3)  # let A be waiting (the contract holds either way)
            await b.decide("a-1", "approved", "go")
        assert len(got) == 1 and got[0] is not None and got[0].status == "approved"


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_waiting_on_an_undecided_approval_times_out(backing: Backing) -> None:
    """Nobody decides: the wait returns None and the approval is still pending."""
    async with backing.open("r") as store:
        await store.add_approval(_approval("a-1"))
        assert await store.wait_decided("a-1", 0.3) is None
        current = await store.approval("a-1")
        assert current is not None and current.status == "pending"


async def test_waiting_on_an_already_decided_approval_returns_at_once(backing: Backing) -> None:
    """A decision made before the wait began is not missed."""
    async with backing.open("r") as store:
        await store.add_approval(_approval("a-1"))
        await store.decide("a-1", "denied", "late")
        decided = await store.wait_decided("a-1", 60)
        assert decided is not None and decided.status == "denied"


async def test_ping(backing: Backing) -> None:
    """An open store answers a ping."""
    async with backing.open("r") as store:
        await store.ping()
        assert store.kind == backing.url.kind


SESSIONS = QuotaLimits(max_sessions=2)


async def test_a_new_session_key_is_claimed_then_open_and_costs_nothing_again(backing: Backing) -> None:
    """max_sessions counts keys: a new key is claimed by its request, open once confirmed, and
    every later request on it is admitted without counting it again."""
    async with backing.open("a") as store:
        first = await store.reserve("t1", SESSIONS, session="s1")
        assert isinstance(first, Reservation) and first.session == "s1"
        assert await store.confirm_session(first, 2)
        await store.release(first)
        again = await store.reserve("t1", SESSIONS, session="s1")
        assert isinstance(again, Reservation) and again.session is None  # open already: nothing claimed
        await store.refund(again)  # a refused later request never frees an open session
        second = await store.reserve("t1", SESSIONS, session="s2")
        assert isinstance(second, Reservation)
        assert await store.confirm_session(second, 2)
        third = await store.reserve("t1", SESSIONS, session="s3")
        assert isinstance(third, Refused) and (third.quota, third.held, third.limit) == ("max_sessions", 2, 2)
        assert isinstance(await store.reserve("t2", SESSIONS, session="s3"), Reservation)  # another tenant's own
        await store.close_sessions("t1", ["s1"])
        assert isinstance(await store.reserve("t1", SESSIONS, session="s3"), Reservation)


async def test_a_claim_goes_back_only_with_its_last_refused_request(backing: Backing) -> None:
    """Two requests reach a new key before either is admitted: they share one claim, and the
    key is free again only when both were refused."""
    async with two(backing) as (a, b):
        one = await a.reserve("t1", SESSIONS, session="s1")
        other = await b.reserve("t1", SESSIONS, session="s1")
        assert isinstance(one, Reservation) and isinstance(other, Reservation)
        filler = await a.reserve("t1", SESSIONS, session="s2")
        assert isinstance(filler, Reservation)
        await a.refund(one)
        refused = await b.reserve("t1", SESSIONS, session="s3")
        assert isinstance(refused, Refused) and refused.held == 2  # s1 is still claimed by `other`
        await b.refund(other)
        assert isinstance(await b.reserve("t1", SESSIONS, session="s3"), Reservation)


async def test_a_refused_call_refunds_its_session_claim_in_the_same_step(backing: Backing) -> None:
    """A request refused for its calls takes no session either."""
    limits = QuotaLimits(max_concurrent_calls=1, max_sessions=5)
    async with backing.open("a") as store:
        running = await store.reserve("t1", limits, session="s1")
        assert isinstance(running, Reservation)
        refused = await store.reserve("t1", limits, session="s2")
        assert isinstance(refused, Refused) and refused.quota == "max_concurrent_calls"
        await store.release(running)
        for key in ("s3", "s4", "s5", "s6"):  # s1 claimed, s2 never taken: four more new keys fit
            taken = await store.reserve("t1", limits, session=key)
            assert isinstance(taken, Reservation), taken
            await store.release(taken)
        refused_too = await store.reserve("t1", limits, session="s7")
        assert isinstance(refused_too, Refused) and refused_too.quota == "max_sessions"


async def test_a_burst_of_new_sessions_across_two_instances_never_passes_max_sessions(backing: Backing) -> None:
    """Ten new keys at once, five through each instance, under max_sessions 2: two admitted."""
    results: list[Reservation | Refused] = []
    async with two(backing) as (a, b):

        async def one(store: StateStore, key: str) -> None:
            results.append(await store.reserve("t1", SESSIONS, calls=0, slots=0, session=key))

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(one, a if i % 2 else b, f"s{i}")
        assert sum(isinstance(r, Reservation) for r in results) == 2
        assert {r.quota for r in results if isinstance(r, Refused)} == {"max_sessions"}


async def test_a_lost_claim_stops_counting(backing: Backing, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim whose replica never confirmed nor refunded it (it died) stops counting after
    CLAIM_KEEP_S; an open session never does."""
    from sandbox.state.postgres import quotas as pg_quotas
    from sandbox.state.sqlite import quotas as lite_quotas

    async with backing.open("a") as store:
        kept = await store.reserve("t1", SESSIONS, session="open")
        assert isinstance(kept, Reservation)
        assert await store.confirm_session(kept, 2)
        assert isinstance(await store.reserve("t1", SESSIONS, session="lost"), Reservation)
        assert isinstance(await store.reserve("t1", SESSIONS, session="new"), Refused)
        monkeypatch.setattr(pg_quotas, "CLAIM_KEEP_S", 0.5)
        monkeypatch.setattr(lite_quotas, "CLAIM_KEEP_S", 0.5)
        await anyio.sleep(0.7)
        fresh = await store.reserve("t1", SESSIONS, session="new")
        assert isinstance(fresh, Reservation)  # "lost" went; "open" still counts
        assert isinstance(await store.reserve("t1", SESSIONS, session="third"), Refused)


async def test_a_session_closed_before_its_first_request_is_admitted_takes_a_place_only_if_one_is_free(
    backing: Backing,
) -> None:
    """DELETE of a key whose first request is still being admitted frees its place; another key
    takes it; the first request's confirm then finds no place and is refused (the caller answers
    429), so the tenant never holds more open sessions than its limit."""
    one = QuotaLimits(max_sessions=1)
    async with backing.open("a") as store:
        first = await store.reserve("t1", one, session="k1")
        assert isinstance(first, Reservation) and first.session == "k1"
        await store.close_sessions("t1", ["k1"])
        second = await store.reserve("t1", one, session="k2")
        assert isinstance(second, Reservation)
        assert await store.confirm_session(second, 1)
        assert not await store.confirm_session(first, 1)
        await store.refund(first)
        assert isinstance(await store.reserve("t1", one, session="k3"), Refused)  # k2 alone is open
        await store.close_sessions("t1", ["k2"])
        late = await store.reserve("t1", one, session="k4")
        assert isinstance(late, Reservation)
        await store.close_sessions("t1", ["k4"])
        assert await store.confirm_session(late, 1)  # closed meanwhile, but a place is free: it takes it
