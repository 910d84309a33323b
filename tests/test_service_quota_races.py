"""Quota reservations across awaits: a new session's key shared by two requests (one refused, one
admitted), and a sandbox made by a call that ended while another request's engine list was on
the way. The service's Admission over an orchestrator with the library's fake backend, whose
engine list can be held after it took its snapshot (as a slow engine answer would be)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from fastapi import HTTPException

from sandbox import Orchestrator
from sandbox.api.metrics import Metrics
from sandbox.api.quotas import Admission
from sandbox.api.tenants import Tenants
from sandbox.testing import FakeBackend
from tests.service_helpers import sha

pytestmark = pytest.mark.anyio
TOKEN = "sbx_quota-races"
CONFIG = f"""
tools: {{profile: full}}
tenants:
  - {{id: t, quotas: {{max_sessions: 1, max_sandboxes: 1}}, tokens: [{{name: ci, sha256: {sha(TOKEN)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
    - {{id: a, tenant: t}}
"""


class HeldList(FakeBackend):
    """The fake backend whose engine list, when `hold` is set, takes its snapshot and then waits
    for `go` (the snapshot is what a slow engine answer would carry: the state when it was read)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.go = anyio.Event()
        self.waiting = 0

    async def list(self, *, instance: str | None, tenant: str | None = None) -> Any:
        snapshot = await super().list(instance=instance, tenant=tenant)
        if self.hold:
            self.waiting += 1
            await self.go.wait()
        return snapshot


def caller(config: Any) -> Any:
    who = Tenants(config).from_authorization(f"Bearer {TOKEN}")
    assert who is not None
    return who


async def until(condition: Any) -> None:
    with anyio.fail_after(10):
        while not condition():
            await anyio.sleep(0.01)


async def test_a_refused_request_does_not_free_a_key_another_request_runs_on(make_config: Any) -> None:
    """Two requests on one new key wait in the sandbox check; the first (which took the key) is
    cancelled (refused), the second admitted. The key still counts toward max_sessions 1 (the refund removed it,
    and a third request on another key was admitted: two sessions under a quota of one)."""
    config = make_config(CONFIG.replace("max_sandboxes: 1", "max_sandboxes: 5"))
    backend = HeldList()
    async with Orchestrator(config, backend=backend) as orch:
        admission = Admission(SimpleNamespace(stopping=False), Metrics())
        who = caller(config)
        key = orch.session("agent:a:k", agent="a")
        backend.hold = True
        admitted = anyio.Event()
        done = anyio.Event()

        async def second() -> None:
            async with admission.admit(orch, who, key):
                admitted.set()
                await done.wait()

        first = anyio.CancelScope()

        async def first_request() -> None:
            with first:
                async with admission.admit(orch, who, key):
                    raise AssertionError("the first request is cancelled before it runs")

        async with anyio.create_task_group() as tg:
            tg.start_soon(first_request)  # takes the new key
            await until(lambda: backend.waiting == 1)
            tg.start_soon(second)  # finds the key taken: no new session for it
            await until(lambda: backend.waiting == 2)
            first.cancel()  # refused (or its client went away) while its check awaited
            await until(lambda: first.cancelled_caught)
            backend.hold = False
            backend.go.set()
            await admitted.wait()
            other = orch.session("agent:a:other", agent="a")
            with pytest.raises(HTTPException) as refused:
                async with admission.admit(orch, who, other):
                    pass
            done.set()
        assert refused.value.status_code == 429 and "max_sessions" in str(refused.value.detail)
        assert admission.use["t"].sessions == {"agent:a:k"}


async def test_a_sandbox_made_by_an_ended_call_counts_until_the_engine_lists_it(make_config: Any) -> None:
    """Under max_sandboxes 1: a request on a second session reads the engine's list before the
    first session's sandbox exists; the first call makes its sandbox and ends; the second
    request's check then sees neither the sandbox (its list is older) nor a reservation (it went
    with the call): it was admitted, two sandboxes under a quota of one. Now it is 429."""
    config = make_config(CONFIG.replace("max_sessions: 1", "max_sessions: 5"))
    backend = HeldList()
    async with Orchestrator(config, backend=backend) as orch:
        admission = Admission(SimpleNamespace(stopping=False), Metrics())
        who = caller(config)
        one, two = orch.session("agent:a:one", agent="a"), orch.session("agent:a:two", agent="a")
        outcome: list[Any] = []
        first_in = anyio.Event()
        make = anyio.Event()
        first_done = anyio.Event()

        async def first() -> None:
            async with admission.admit(orch, who, one):
                first_in.set()
                await make.wait()
                await orch.manager.sandbox_for(one.agent, one.key)  # the call makes its sandbox
            first_done.set()  # ...and ends

        async def second() -> None:
            try:
                async with admission.admit(orch, who, two):
                    outcome.append("admitted")
            except HTTPException as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await first_in.wait()
            backend.hold = True
            tg.start_soon(second)
            await until(lambda: backend.waiting == 1)  # its snapshot: no sandbox yet
            backend.hold = False
            make.set()
            await first_done.wait()
            backend.go.set()
        made = [s for s in backend.sandboxes.values() if s.spec.tenant == "t"]
        assert len(made) == 1
        assert len(outcome) == 1 and isinstance(outcome[0], HTTPException), outcome
        assert outcome[0].status_code == 429 and "max_sandboxes" in str(outcome[0].detail)


async def test_without_a_session_limit_no_session_key_is_kept(make_config: Any) -> None:
    """A tenant with call quotas but no max_sessions: the keys it uses are not counted, so a
    month of sessions never closed does not pile up in the service's memory."""
    config = make_config(CONFIG.replace("max_sessions: 1, max_sandboxes: 1", "max_calls_per_minute: 1000"))
    async with Orchestrator(config, backend=HeldList()) as orch:
        admission = Admission(SimpleNamespace(stopping=False), Metrics())
        who = caller(config)
        for i in range(50):
            async with admission.admit(orch, who, orch.session(f"agent:a:k{i}", agent="a")):
                pass
        assert admission.use["t"].sessions == set() and admission.use["t"].claims == {}
        assert len(admission.use["t"].started) == 50  # the call quota still counts
