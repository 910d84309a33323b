"""Quotas are reserved, not just checked: bursts of simultaneous requests on new sessions against
each quota set to 1, and batches whose every call counts. The service runs for real (uvicorn, its
own protocol, loopback) over an orchestrator with the library's fake backend: the quota logic is
the service's, not the engine's (test_service_hostile_docker.py bursts max_sandboxes against the
real engine). A held call waits in the fake sandbox until the test lets it go, so "at once" is
exact, not a matter of timing."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from sandbox import Orchestrator
from sandbox.api.app import create_app
from sandbox.testing import FakeBackend, FakeCall, exec_result
from tests.service_helpers import serving, sha

pytestmark = pytest.mark.anyio

TOKENS = {name: f"sbx_quota-{name}" for name in ("conc", "sess", "boxes", "rate", "refund")}
H = {name: {"Authorization": f"Bearer {token}"} for name, token in TOKENS.items()}
HOLD = "echo held-call"


def config_text() -> str:
    quotas = {
        "conc": "max_concurrent_calls: 1",
        "sess": "max_sessions: 1, max_sandboxes: 10",
        "boxes": "max_sandboxes: 1",
        "rate": "max_calls_per_minute: 5",
        "refund": "max_calls_per_minute: 2, max_sessions: 1",
    }
    tenants = "\n".join(
        f"  - {{id: {n}, quotas: {{{q}}}, tokens: [{{name: ci, sha256: {sha(TOKENS[n])}}}]}}" for n, q in quotas.items()
    )
    agents = "\n".join(f"    - {{id: {n}-agent, tenant: {n}}}" for n in quotas)
    return f"""
tools: {{profile: full}}
tenants:
{tenants}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
{agents}
"""


class Gate:
    """Holds every call of HOLD in the fake sandbox until `go`; counts how many ran at once."""

    def __init__(self) -> None:
        self.go = anyio.Event()
        self.running = 0
        self.most = 0
        self.held = 0

    async def handle(self, call: FakeCall) -> Any:
        if call.command is None or HOLD not in call.command:
            return exec_result()
        self.held += 1
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.go.wait()
        finally:
            self.running -= 1
        return exec_result(stdout=b"held-call\n")


class EngineLikeBackend(FakeBackend):
    """The fake backend, except that asking the engine what exists yields to the event loop, as
    the real engine's calls do (each is a thread hop): the old quota checks raced exactly there."""

    async def exists(self, name: str) -> bool:
        await anyio.sleep(0.01)
        return await super().exists(name)

    async def list(self, *, instance: str | None, tenant: str | None = None) -> Any:
        await anyio.sleep(0.01)
        return await super().list(instance=instance, tenant=tenant)


@pytest.fixture
async def service(make_config: Any) -> Any:
    gate = Gate()
    backend = EngineLikeBackend(gate.handle)
    config = make_config(config_text())
    async with Orchestrator(config, backend=backend) as orch, serving(create_app(config, orch)) as url:
        yield url, gate, backend


async def burst(url: str, tenant: str, requests: list[tuple[str, dict[str, Any]]], gate: Gate) -> list[httpx.Response]:
    """Send `requests` (path, JSON) at once: every request's head first, then, once all heads are
    out, every body (a client may always do this; the old check-then-count let all four through
    the check while their bodies were on the way). Once all but one have answered, the held call
    is let go."""
    answers: dict[int, httpx.Response] = {}
    heads_out = 0
    all_heads_out = anyio.Event()

    async def body_after_every_head(body: dict[str, Any]) -> Any:
        nonlocal heads_out
        heads_out += 1
        if heads_out == len(requests):
            all_heads_out.set()
        await all_heads_out.wait()
        await anyio.sleep(0.05)  # let the server take in every head before any body
        yield json.dumps(body).encode()

    async with httpx.AsyncClient(base_url=url, headers=H[tenant], timeout=60) as client:

        async def one(i: int, path: str, body: dict[str, Any]) -> None:
            answers[i] = await client.post(
                path, content=body_after_every_head(body), headers={"content-type": "application/json"}
            )

        async with anyio.create_task_group() as tg:
            for i, (path, body) in enumerate(requests):
                tg.start_soon(one, i, path, body)
            # the old code let several through: they all wait in the gate and this times out
            with anyio.fail_after(20):
                while len(answers) < len(requests) - 1:
                    await anyio.sleep(0.02)
            gate.go.set()
    return [answers[i] for i in range(len(requests))]


def held(key: str) -> tuple[str, dict[str, Any]]:
    return f"/v1/sessions/{key}/calls", {"tool": "exec", "args": {"command": HOLD}}


def codes(answers: list[httpx.Response]) -> list[int]:
    return sorted(a.status_code for a in answers)


@pytest.mark.slow
async def test_four_calls_at_once_under_max_concurrent_calls_1(service: Any) -> None:
    """Four simultaneous calls on four new sessions, max_concurrent_calls 1: one runs, three are
    429 (three ran at once before); the slot is given back when the call ends."""
    url, gate, _ = service
    answers = await burst(url, "conc", [held(f"agent:conc-agent:c{i}") for i in range(4)], gate)
    print(f"max_concurrent_calls 1, 4 at once: statuses {codes(answers)}, {gate.most} ran at once")
    assert codes(answers) == [200, 429, 429, 429] and gate.most == 1
    assert all("max_concurrent_calls" in a.text for a in answers if a.status_code == 429)
    async with httpx.AsyncClient(base_url=url, headers=H["conc"], timeout=30) as client:
        again = await client.post(*held("agent:conc-agent:c9")[:1], json=held("x")[1])
    assert again.status_code == 200, again.text


@pytest.mark.slow
async def test_four_new_sessions_at_once_under_max_sessions_1(service: Any) -> None:
    """Four simultaneous calls on four new sessions, max_sessions 1: one session is admitted (four
    were, while the sandbox check awaited the engine); closing it frees the quota."""
    url, gate, _ = service
    answers = await burst(url, "sess", [held(f"agent:sess-agent:s{i}") for i in range(4)], gate)
    print(f"max_sessions 1, 4 at once: statuses {codes(answers)}")
    assert codes(answers) == [200, 429, 429, 429]
    assert all("max_sessions" in a.text for a in answers if a.status_code == 429)
    admitted = next(i for i, a in enumerate(answers) if a.status_code == 200)
    async with httpx.AsyncClient(base_url=url, headers=H["sess"], timeout=30) as client:
        assert (await client.delete(f"/v1/sessions/agent:sess-agent:s{admitted}")).status_code == 200
        path, body = held("agent:sess-agent:fresh")
        gate.go = anyio.Event()
        gate.go.set()
        assert (await client.post(path, json=body)).status_code == 200


@pytest.mark.slow
async def test_four_new_sandboxes_at_once_under_max_sandboxes_1(service: Any) -> None:
    """Four simultaneous calls on four new sessions (a sandbox each), max_sandboxes 1: one sandbox
    is made, three requests are 429 (3-4 sandboxes were made: each check saw none yet)."""
    url, gate, backend = service
    answers = await burst(url, "boxes", [held(f"agent:boxes-agent:b{i}") for i in range(4)], gate)
    made = [s for s in backend.sandboxes.values() if s.spec.tenant == "boxes"]
    print(f"max_sandboxes 1, 4 at once (fake engine): statuses {codes(answers)}, {len(made)} sandboxes made")
    assert codes(answers) == [200, 429, 429, 429] and len(made) == 1
    assert all("max_sandboxes" in a.text for a in answers if a.status_code == 429)


@pytest.mark.slow
async def test_every_call_of_a_batch_counts_toward_the_rate(service: Any) -> None:
    """Under max_calls_per_minute 5: a batch of 64 is refused whole (400: it can never fit; it
    counted as one call and 64 ran), a batch of 3 runs, a second batch of 3 is 429, and no more
    than 5 calls ran in all."""
    url, gate, backend = service
    gate.go.set()

    def batch(n: int) -> dict[str, Any]:
        return {"calls": [{"tool": "exec", "args": {"command": f"{HOLD} {i}"}} for i in range(n)]}

    async with httpx.AsyncClient(base_url=url, headers=H["rate"], timeout=30) as client:
        path = "/v1/sessions/agent:rate-agent:r/batches"
        huge = await client.post(path, json=batch(64))
        first = await client.post(path, json=batch(3))
        second = await client.post(path, json=batch(3))
        single = [await client.post("/v1/sessions/agent:rate-agent:r/calls", json=held("x")[1]) for _ in range(3)]
    ran = sum(1 for c in backend.calls if c.command and HOLD in c.command)
    print(
        f"batches under 5/min: 64 -> {huge.status_code}, 3 -> {first.status_code}, 3 -> {second.status_code}, "
        f"then singles {[s.status_code for s in single]}; {ran} calls ran"
    )
    assert huge.status_code == 400 and "max_calls_per_minute" in huge.text
    assert first.status_code == 200 and len(first.json()["results"]) == 3
    assert second.status_code == 429
    assert [s.status_code for s in single] == [200, 200, 429]
    assert ran == 5


@pytest.mark.slow
async def test_a_parallel_batch_counts_its_width_toward_max_concurrent_calls(service: Any) -> None:
    """Under max_concurrent_calls 1 a parallel batch of two independent calls would run two at
    once: refused (400, saying to run it sequentially); the same batch in sequence runs."""
    url, gate, _ = service
    gate.go.set()
    calls = [{"tool": "exec", "args": {"command": HOLD}}, {"tool": "exec", "args": {"command": HOLD}}]
    async with httpx.AsyncClient(base_url=url, headers=H["conc"], timeout=30) as client:
        parallel = await client.post("/v1/sessions/agent:conc-agent:p/batches", json={"calls": calls})
        sequential = await client.post(
            "/v1/sessions/agent:conc-agent:p/batches", json={"calls": calls, "mode": "sequential"}
        )
    assert parallel.status_code == 400 and "sequential" in parallel.text
    assert sequential.status_code == 200 and sequential.json()["status"] == "SUCCESS", sequential.text
    assert gate.most == 1


@pytest.mark.slow
async def test_a_refused_request_gives_back_what_it_took(service: Any) -> None:
    """A call refused for max_sessions does not use up the tenant's calls per minute (it ran
    nothing): with a rate of 2, two admitted calls still fit around two refused ones."""
    url, gate, _ = service
    gate.go.set()
    async with httpx.AsyncClient(base_url=url, headers=H["refund"], timeout=30) as client:
        path, body = held("agent:refund-agent:one")
        assert (await client.post(path, json=body)).status_code == 200
        for other in ("two", "three"):
            refused = await client.post(held(f"agent:refund-agent:{other}")[0], json=body)
            assert refused.status_code == 429 and "max_sessions" in refused.text
        assert (await client.post(path, json=body)).status_code == 200
        past = await client.post(path, json=body)
    assert past.status_code == 429 and "max_calls_per_minute" in past.text


class BackendFromBeforeTenant(FakeBackend):
    """A third-party backend written before `list` took `tenant`: it lists an instance's all."""

    async def list(self, *, instance: str | None) -> Any:  # type: ignore[override]
        return await super().list(instance=instance)


@pytest.mark.slow  # a service started and stopped: 0.9 s
async def test_max_sandboxes_holds_on_a_backend_that_cannot_list_one_tenant(make_config: Any) -> None:
    """max_sandboxes asks the backend for one tenant's sandboxes; one that cannot be asked so is
    asked for all and its answer filtered (it failed every call with a TypeError before), and
    another tenant's sandboxes still do not count."""
    backend: Any = BackendFromBeforeTenant()  # not the protocol of today: that is the point
    config = make_config(config_text())
    async with Orchestrator(config, backend=backend) as orch, serving(create_app(config, orch)) as url:
        call = {"tool": "exec", "args": {"command": "true"}}
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            other = await client.post("/v1/sessions/agent:sess-agent:o1/calls", json=call, headers=H["sess"])
            first = await client.post("/v1/sessions/agent:boxes-agent:b1/calls", json=call, headers=H["boxes"])
            again = await client.post("/v1/sessions/agent:boxes-agent:b1/calls", json=call, headers=H["boxes"])
            second = await client.post("/v1/sessions/agent:boxes-agent:b2/calls", json=call, headers=H["boxes"])
        assert [other.status_code, first.status_code, again.status_code] == [200, 200, 200], (other.text, first.text)
        assert second.status_code == 429 and "max_sandboxes is 1" in second.text, second.text
        assert [s.tenant for s in await orch.manager.list(tenant="boxes")] == ["boxes"]
