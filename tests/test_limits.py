"""The multi-level FIFO limiter with fake work (pure, fast)."""

from __future__ import annotations

import anyio
import pytest

from sandbox.config.models import LimitsConfig, QueueConfig
from sandbox.engine.limits import Limiter
from sandbox.errors import ErrorCode, SandboxError

pytestmark = pytest.mark.anyio


def limiter(**kw: object) -> Limiter:
    queue = QueueConfig(max_depth=kw.pop("max_depth", 1000), max_wait_s=kw.pop("max_wait_s", 30))
    return Limiter(LimitsConfig(queue=queue, **kw))


async def test_category_limit_never_exceeded_and_all_complete() -> None:
    """60 exec calls with global 10 / exec 2: at most 2 run at once, all complete."""
    lim = limiter(global_concurrency=10, categories={"exec": 2}, tenant_concurrency=10)
    running, peak, done = 0, 0, 0

    async def call() -> None:
        nonlocal running, peak, done
        async with lim.permit(tenant="t", category="exec", tool="exec"):
            running += 1
            peak = max(peak, running)
            await anyio.sleep(0.001)
            running -= 1
            done += 1

    async with anyio.create_task_group() as tg:
        for _ in range(60):
            tg.start_soon(call)
    assert peak == 2 and done == 60
    assert lim.in_use(("global",)) == 0 and lim.waiting == 0


async def test_fifo_order() -> None:
    """Waiters on one level are served in arrival order."""
    lim = limiter(global_concurrency=1, tenant_concurrency=1)
    order: list[int] = []
    gate = anyio.Event()

    async def first() -> None:
        async with lim.permit(tenant="t", category="file", tool="read"):
            await gate.wait()

    async def later(i: int) -> None:
        async with lim.permit(tenant="t", category="file", tool="read"):
            order.append(i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await wait_until(lambda: lim.in_use(("global",)) == 1)
        for i in range(5):
            tg.start_soon(later, i)
            await wait_until(lambda i=i: lim.waiting == i + 1)  # arrived, in this order
        gate.set()
    assert order == [0, 1, 2, 3, 4]


async def test_other_levels_are_not_blocked() -> None:
    """A call waiting on the exec limit does not hold back a file call."""
    lim = limiter(global_concurrency=10, categories={"exec": 1, "file": 5}, tenant_concurrency=10)
    gate = anyio.Event()
    file_done = anyio.Event()

    async def hold_exec() -> None:
        async with lim.permit(tenant="t", category="exec", tool="exec"):
            await gate.wait()

    async def wait_exec() -> None:
        async with lim.permit(tenant="t", category="exec", tool="exec"):
            pass

    async def file_call() -> None:
        async with lim.permit(tenant="t", category="file", tool="read"):
            file_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold_exec)
        await wait_until(lambda: lim.in_use(("global",)) == 1)
        tg.start_soon(wait_exec)
        await wait_until(lambda: lim.waiting == 1)
        tg.start_soon(file_call)
        with anyio.fail_after(2):
            await file_done.wait()
        gate.set()


async def test_queue_full_and_queue_timeout() -> None:
    """Past max_depth a call gets QUEUE_FULL at once; waiting past max_wait_s gets QUEUE_TIMEOUT."""
    lim = limiter(global_concurrency=1, tenant_concurrency=1, max_depth=1, max_wait_s=0.2)
    gate = anyio.Event()
    errors: list[ErrorCode] = []

    async def hold() -> None:
        async with lim.permit(tenant="t", category="file", tool="read"):
            await gate.wait()

    async def try_call() -> None:
        try:
            async with lim.permit(tenant="t", category="file", tool="read"):
                pass
        except SandboxError as exc:
            errors.append(exc.code)

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await wait_until(lambda: lim.in_use(("global",)) == 1)
        tg.start_soon(try_call)  # waits, then times out
        await wait_until(lambda: lim.waiting == 1)
        tg.start_soon(try_call)  # queue full
        await wait_until(lambda: len(errors) == 2)
        gate.set()
    assert sorted(errors) == [ErrorCode.QUEUE_FULL, ErrorCode.QUEUE_TIMEOUT]
    assert SandboxError(ErrorCode.QUEUE_TIMEOUT, "").retryable


@pytest.mark.slow
async def test_thousand_cancelled_waiters_leak_nothing() -> None:
    """1,000 waiters cancelled while queued leave every permit available."""
    lim = limiter(global_concurrency=3, tenant_concurrency=3, max_depth=2000)
    gate = anyio.Event()

    async def hold() -> None:
        async with lim.permit(tenant="t", category="file", tool="read"):
            await gate.wait()

    async def waiter() -> None:
        async with lim.permit(tenant="t", category="file", tool="read"):
            pass

    async with anyio.create_task_group() as holders:
        for _ in range(3):
            holders.start_soon(hold)
        await wait_until(lambda: lim.in_use(("global",)) == 3)
        async with anyio.create_task_group() as tg:
            for _ in range(1000):
                tg.start_soon(waiter)
            await wait_until(lambda: lim.waiting == 1000)
            tg.cancel_scope.cancel()
        gate.set()
    assert lim.waiting == 0 and lim.in_use(("global",)) == 0
    # the full limit is available again: 3 at once without waiting
    async with (
        lim.permit(tenant="t", category="file", tool="read") as w1,
        lim.permit(tenant="t", category="file", tool="read") as w2,
        lim.permit(tenant="t", category="file", tool="read") as w3,
    ):
        assert (w1, w2, w3) == (0, 0, 0) or max(w1, w2, w3) < 0.01


async def test_permit_released_when_work_crashes() -> None:
    """A handler that raises still gives its permit back."""
    lim = limiter(global_concurrency=1, tenant_concurrency=1)
    with pytest.raises(RuntimeError):
        async with lim.permit(tenant="t", category="file", tool="read"):
            raise RuntimeError("boom")
    assert lim.in_use(("global",)) == 0


async def test_one_tenant_cannot_take_everything() -> None:
    """With global 4, a busy tenant holds at most its share; another tenant still gets in."""
    lim = limiter(global_concurrency=4)  # tenant share: 2
    gate = anyio.Event()
    other_in = anyio.Event()

    async def greedy() -> None:
        async with lim.permit(tenant="greedy", category="file", tool="read"):
            await gate.wait()

    async def other() -> None:
        async with lim.permit(tenant="other", category="file", tool="read"):
            other_in.set()

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(greedy)
        await wait_until(lambda: lim.waiting == 8)
        assert lim.in_use(("tenant", "greedy")) == 2
        tg.start_soon(other)
        with anyio.fail_after(2):
            await other_in.wait()
        gate.set()


def test_tenant_share_is_below_every_limit() -> None:
    """A tenant's share of a shared level is at least 1 and below the limit (except a limit of 1)."""
    from sandbox.engine.limits import tenant_share

    assert [tenant_share(n) for n in (1, 2, 3, 4, 5, 10)] == [1, 1, 2, 2, 3, 5]


async def test_one_tenant_never_holds_every_exec_permit_when_tenants_share() -> None:
    """With three tenants, tenant A flooding exec (limit 2) leaves a permit for B and C."""
    lim = Limiter(
        LimitsConfig(global_concurrency=10, categories={"exec": 2}, queue=QueueConfig(max_depth=100, max_wait_s=30)),
        multi_tenant=True,
    )
    gate = anyio.Event()
    started: list[str] = []

    async def call(tenant: str) -> None:
        async with lim.permit(tenant=tenant, category="exec", tool="exec"):
            started.append(tenant)
            await gate.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(call, "a")
        await wait_until(lambda: lim.waiting == 3)
        tg.start_soon(call, "b")
        await wait_until(lambda: started == ["a", "b"])
        assert lim.in_use(("tenant", "a", "category", "exec")) == 1
        gate.set()
    assert started[:2] == ["a", "b"] and sorted(started) == ["a", "a", "a", "a", "b"]


async def test_waiters_are_served_round_robin_across_tenants() -> None:
    """Tenant A queues 6 calls first, then B and C 2 each: grants alternate a, b, c, not a x6."""
    lim = Limiter(LimitsConfig(global_concurrency=1, tenant_concurrency=1, queue=QueueConfig(max_depth=100)))
    order: list[str] = []
    gate = anyio.Event()

    async def hold() -> None:
        async with lim.permit(tenant="z", category="file", tool="read"):
            await gate.wait()

    async def call(tenant: str, i: int) -> None:
        async with lim.permit(tenant=tenant, category="file", tool="read"):
            order.append(f"{tenant}{i}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await wait_until(lambda: lim.in_use(("global",)) == 1)
        for i in range(6):
            tg.start_soon(call, "a", i)
        await wait_until(lambda: lim.waiting == 6)
        for t in ("b", "c"):
            for i in range(2):
                tg.start_soon(call, t, i)
        await wait_until(lambda: lim.waiting == 10)
        gate.set()
    assert order == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "a3", "a4", "a5"]


async def wait_until(condition: object, deadline_s: float = 5.0) -> None:
    """Poll a condition with a deadline (no timing assumptions)."""
    with anyio.fail_after(deadline_s):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.001)
