"""Limits around real exec in a real sandbox, measured inside the container."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from sandbox import Orchestrator

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

# Each command counts itself in and out under flock; the peak is what ran at once.
COUNT = (
    "flock /tmp/c.lock sh -c 'n=$(( $(cat /tmp/c 2>/dev/null || echo 0) + 1 )); echo $n > /tmp/c; echo $n >> /tmp/peak';"
    " sleep 0.1;"
    " flock /tmp/c.lock sh -c 'echo $(( $(cat /tmp/c) - 1 )) > /tmp/c'"
)


@pytest.mark.parametrize(("max_depth", "expect_full"), [(100, 0), (20, 38)])
async def test_sixty_execs_never_exceed_the_exec_limit(make_config: Any, max_depth: int, expect_full: int) -> None:
    """60 concurrent execs with global 10 / exec 2: never more than 2 inside; all run or get QUEUE_FULL."""
    config = make_config(
        f"limits: {{global_concurrency: 10, tenant_concurrency: 10, categories: {{exec: 2}}, queue: {{max_depth: {max_depth}, max_wait_s: 120}}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: agent}}}"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:limits")
        await sess.call("exec", {"command": "rm -f /tmp/c /tmp/peak"})
        results: list[Any] = []

        async def one() -> None:
            results.append(await sess.call("exec", {"command": COUNT}))

        async with anyio.create_task_group() as tg:
            for _ in range(60):
                tg.start_soon(one)
        codes = [r.error.code if r.error else "ok" for r in results]
        assert codes.count("QUEUE_FULL") == expect_full
        assert codes.count("ok") == 60 - expect_full
        peak = await sess.call("exec", {"command": "sort -n /tmp/peak | tail -1; wc -l < /tmp/peak"})
        top, count = peak.output["output"].split()
        assert int(top) == 2 and int(count) == 60 - expect_full
