"""Two service replicas on one PostgreSQL (`state.url`): the call quotas are reserved in the
shared store, so a burst split across the replicas never passes max_concurrent_calls. Both
services run for real (uvicorn on loopback) over orchestrators with the library's fake backend,
whose held calls wait until the test lets them go (so "at once" is exact, not timing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sandbox import Orchestrator
from sandbox.api.app import create_app
from sandbox.config.state import parse_state_url
from sandbox.state import open_store
from sandbox.state.admin import migrate_store
from sandbox.testing import FakeBackend, FakeCall, exec_result
from tests.cli_helpers import run_cli
from tests.pg_server import PgServer
from tests.service_helpers import free_port, serving, sha

pytestmark = pytest.mark.postgres

TOKEN = "sbx_shared-store"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
HOLD = "echo held-call"


class Gate:
    """Holds every call of HOLD until `go`, in whichever replica it runs; counts the most at once."""

    def __init__(self) -> None:
        self.go = anyio.Event()
        self.running = 0
        self.most = 0

    async def handle(self, call: FakeCall) -> Any:
        if call.command is None or HOLD not in call.command:
            return exec_result()
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.go.wait()
        finally:
            self.running -= 1
        return exec_result(stdout=b"held-call\n")


def _host_config(make_config: Any, pg_url: str, ws: Path, state: Path, tools: str) -> Any:
    """One replica's config: agent `a` on the host (mode off) with workspace `ws`."""
    return make_config(
        f"""
tools: {tools}
state: {{url: '{pg_url}'}}
tenants:
  - {{id: t, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN)}}}]}}
agents:
  list:
    - {{id: a, tenant: t, workspace: '{ws}', sandbox: {{mode: 'off'}}}}
""",
        state=state,
    )


def _config(make_config: Any, pg_url: str, state: Path, tools: str = "{profile: full}") -> Any:
    return make_config(
        f"""
tools: {tools}
state: {{url: '{pg_url}'}}
tenants:
  - {{id: t, quotas: {{max_concurrent_calls: 2}}, tokens: [{{name: ci, sha256: {sha(TOKEN)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
    - {{id: a, tenant: t}}
""",
        state=state,
    )


@pytest.mark.anyio
async def test_a_burst_split_across_two_replicas_never_passes_max_concurrent_calls(
    make_config: Any, pg_url: str, tmp_path: Path
) -> None:
    """8 calls at once, 4 to each replica, under max_concurrent_calls 2: two run, six are 429
    naming the quota; when they end the slots are back (a next call runs, the store holds none)."""
    await migrate_store(parse_state_url(pg_url), tmp_path)
    gate = Gate()
    config_a = _config(make_config, pg_url, tmp_path / "a")
    config_b = _config(make_config, pg_url, tmp_path / "b")
    answers: list[httpx.Response] = []
    async with (
        Orchestrator(config_a, backend=FakeBackend(gate.handle)) as orch_a,
        Orchestrator(config_b, backend=FakeBackend(gate.handle)) as orch_b,
        serving(create_app(config_a, orch_a)) as url_a,
        serving(create_app(config_b, orch_b)) as url_b,
        httpx.AsyncClient(headers=HEADERS, timeout=60) as client,
    ):

        async def one(url: str, i: int) -> None:
            body = {"tool": "exec", "args": {"command": HOLD}}
            answers.append(await client.post(f"{url}/v1/sessions/agent:a:s{i}/calls", json=body))

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, url_a if i % 2 else url_b, i)
            with anyio.fail_after(30):  # six refusals come back while two calls are held
                while len(answers) < 6 or gate.running < 2:
                    await anyio.sleep(0.02)
            await anyio.sleep(0.2)  # a third admitted call (there must be none) would be in by now
            gate.go.set()
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200, 200, 429, 429, 429, 429, 429, 429] and gate.most == 2
        refused = [a for a in answers if a.status_code == 429]
        assert all("max_concurrent_calls" in a.text and "across replicas" in a.text for a in refused)
        again = await client.post(
            f"{url_a}/v1/sessions/agent:a:s0/calls", json={"tool": "exec", "args": {"command": "true"}}
        )
        assert again.status_code == 200, again.text
    async with open_store(parse_state_url(pg_url), tmp_path, owner="observer") as store:
        assert await store.in_flight("t") == 0


@pytest.mark.anyio
async def test_an_approval_waiting_on_one_replica_is_decided_through_the_other(
    make_config: Any, pg_url: str, tmp_path: Path
) -> None:
    """A call needing approval waits on replica A; B lists it and approves it; A's call runs at once
    (woken by NOTIFY: the wait has no polling to fall back on). A second decision through A is 404
    (it is no longer pending), and the journal of A holds no approval: the store does."""
    await migrate_store(parse_state_url(pg_url), tmp_path)
    tools = "{profile: full, approvals: {require: [exec], timeout_s: 120}}"
    config_a = _config(make_config, pg_url, tmp_path / "a", tools)
    config_b = _config(make_config, pg_url, tmp_path / "b", tools)
    answers: list[httpx.Response] = []
    async with (
        Orchestrator(config_a, backend=FakeBackend()) as orch_a,
        Orchestrator(config_b, backend=FakeBackend()) as orch_b,
        serving(create_app(config_a, orch_a)) as url_a,
        serving(create_app(config_b, orch_b)) as url_b,
        httpx.AsyncClient(headers=HEADERS, timeout=60) as client,
    ):

        async def call_on_a() -> None:
            body = {"tool": "exec", "args": {"command": "echo approved-call"}}
            answers.append(await client.post(f"{url_a}/v1/sessions/agent:a:s1/calls", json=body))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call_on_a)
            pending: list[Any] = []
            with anyio.fail_after(30):
                while not pending:
                    pending = (await client.get(f"{url_b}/v1/approvals")).json()
                    await anyio.sleep(0.05)
            assert [p["tool"] for p in pending] == ["exec"]
            decided = await client.post(f"{url_b}/v1/approvals/{pending[0]['id']}/approve")
            assert decided.status_code == 200 and decided.json()["status"] == "approved"
        assert len(answers) == 1 and answers[0].status_code == 200, answers[0].text
        assert answers[0].json()["ok"] is True, answers[0].text
        again = await client.post(f"{url_a}/v1/approvals/{pending[0]['id']}/deny")
        assert again.status_code == 404
        assert orch_a.pending_approvals() == [] and orch_a.journal is not None
        assert orch_a.journal.approvals(None) == []


def test_sandbox_serve_with_an_unusable_store_does_not_start(pg_server: PgServer, tmp_path: Path) -> None:
    """`sandbox serve` checks the store before it listens: a wrong password is one clear line, exit 1."""
    config = tmp_path / "sandbox.yaml"
    url = pg_server.url("postgres", password="not-the-password")
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\nstate: {{url: '{url}'}}\n"
        f"tenants:\n  - {{id: default, tokens: [{{name: ci, sha256: {sha(TOKEN)}}}]}}\n"
    )
    result = run_cli("serve", "--port", str(free_port()), config=config, process=True, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "error [SERVICE_UNAVAILABLE]: the state store at postgresql://sbxtest:***@127.0.0.1" in result.stderr
    assert "password authentication failed" in result.stderr and "not-the-password" not in result.stderr


@pytest.mark.anyio
async def test_the_cli_lists_and_decides_approvals_in_the_shared_store(pg_url: str, tmp_path: Path) -> None:
    """`sandbox approvals list|approve` with state.url on PostgreSQL read and decide there; the
    waiting store instance wakes with the decision."""
    import time

    from sandbox.journal.approvals import Approval

    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    config = tmp_path / "sandbox.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nstate: {{url: '{pg_url}'}}\n")
    pending = Approval(
        "a-cli", "c-1", "t-1", "agent:main:s", "main", "exec", {"command": "ls -la"}, "pending", "", time.time(), None
    )
    async with open_store(url, tmp_path, owner="waiter") as store:
        await store.add_approval(pending)
        listed = await anyio.to_thread.run_sync(lambda: run_cli("approvals", "list", config=config))
        assert listed.returncode == 0 and "a-cli" in listed.stdout and "ls -la" in listed.stdout
        decided = await anyio.to_thread.run_sync(
            lambda: run_cli("approvals", "approve", "a-cli", "--reason", "ok", config=config)
        )
        assert decided.returncode == 0 and "a-cli: approved (ok)" in decided.stdout
        woken = await store.wait_decided("a-cli", 60)
        assert woken is not None and woken.status == "approved"


@pytest.mark.anyio
async def test_an_idempotency_key_is_one_call_across_replicas(make_config: Any, pg_url: str, tmp_path: Path) -> None:
    """A keyed call held on replica A; the same key through replica B waits for it (woken by
    NOTIFY) instead of running again, and both get A's result; B reads the handle of A's call;
    the same key for another call is 422 through either; nothing is in the replicas' journals."""
    await migrate_store(parse_state_url(pg_url), tmp_path)
    gate = Gate()
    runs: list[str] = []

    async def counted(call: FakeCall) -> Any:
        runs.append(call.command or "")
        return await gate.handle(call)

    config_a = _config(make_config, pg_url, tmp_path / "a")
    config_b = _config(make_config, pg_url, tmp_path / "b")
    answers: dict[str, httpx.Response] = {}
    body = {"tool": "exec", "args": {"command": HOLD}}
    keyed = {"Idempotency-Key": "across-1"}
    async with (
        Orchestrator(config_a, backend=FakeBackend(counted)) as orch_a,
        Orchestrator(config_b, backend=FakeBackend(counted)) as orch_b,
        serving(create_app(config_a, orch_a)) as url_a,
        serving(create_app(config_b, orch_b)) as url_b,
        httpx.AsyncClient(headers=HEADERS, timeout=60) as client,
    ):

        async def post(name: str, url: str) -> None:
            answers[name] = await client.post(f"{url}/v1/sessions/agent:a:s1/calls", json=body, headers=keyed)

        async with anyio.create_task_group() as tg:
            tg.start_soon(post, "a", url_a)
            with anyio.fail_after(30):
                while gate.running == 0:
                    await anyio.sleep(0.02)
            tg.start_soon(post, "b", url_b)
            await anyio.sleep(0.5)
            assert "b" not in answers  # B waits for A's call, it does not run it
            other = await client.post(
                f"{url_b}/v1/sessions/agent:a:s1/calls",
                json={"tool": "exec", "args": {"command": "true"}},
                headers=keyed,
            )
            assert other.status_code == 422 and other.json()["idempotency_key"] == "across-1", other.text
            gate.go.set()
        first, repeat = answers["a"], answers["b"]
        assert first.status_code == repeat.status_code == 200, (first.text, repeat.text)
        assert repeat.json()["call_id"] == first.json()["call_id"] and repeat.json()["output"] == first.json()["output"]
        assert [r for r in runs if HOLD in r] == [HOLD]  # one run, on A
        seen = (await client.get(f"{url_b}/v1/calls/{first.json()['call_id']}")).json()
        assert seen["state"] == "finished" and seen["result"]["call_id"] == first.json()["call_id"]
        assert orch_a.journal is not None and orch_a.journal.call_record(first.json()["call_id"]) is None


@pytest.mark.anyio
async def test_a_burst_of_one_key_split_across_two_replicas_runs_once(
    make_config: Any, pg_url: str, tmp_path: Path
) -> None:
    """8 requests with one Idempotency-Key at once, 4 to each replica, under max_concurrent_calls 2:
    the tool runs once across both replicas, and every admitted request answers that one call. A
    request that finds the key held gives its slot back at once (it runs nothing), so more than
    two may be admitted; the others are 429 naming the quota, counted in the shared store."""
    await migrate_store(parse_state_url(pg_url), tmp_path)
    gate = Gate()
    runs: list[str] = []

    async def counted(call: FakeCall) -> Any:
        runs.append(call.command or "")
        return await gate.handle(call)

    config_a = _config(make_config, pg_url, tmp_path / "a")
    config_b = _config(make_config, pg_url, tmp_path / "b")
    answers: list[httpx.Response] = []
    async with (
        Orchestrator(config_a, backend=FakeBackend(counted)) as orch_a,
        Orchestrator(config_b, backend=FakeBackend(counted)) as orch_b,
        serving(create_app(config_a, orch_a)) as url_a,
        serving(create_app(config_b, orch_b)) as url_b,
        httpx.AsyncClient(headers={**HEADERS, "Idempotency-Key": "burst-1"}, timeout=60) as client,
    ):

        async def one(url: str) -> None:
            body = {"tool": "exec", "args": {"command": HOLD}}
            answers.append(await client.post(f"{url}/v1/sessions/agent:a:s1/calls", json=body))

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, url_a if i % 2 else url_b)
            with anyio.fail_after(30):  # the run is held; the refused and the repeats are settled meanwhile
                while gate.running == 0:
                    await anyio.sleep(0.02)
            await anyio.sleep(1.0)
            gate.go.set()
    assert len(answers) == 8 and {a.status_code for a in answers} <= {200, 429}, [a.text for a in answers]
    admitted = [a.json() for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(admitted) >= 2 and all(r.json()["detail"].endswith("counted across replicas)") for r in refused)
    assert len({a["call_id"] for a in admitted}) == 1 and all(a["ok"] for a in admitted)
    assert [r for r in runs if HOLD in r] == [HOLD]  # one run across both replicas


@pytest.mark.anyio
async def test_a_loop_spread_over_two_replicas_is_caught_and_its_breaker_holds_on_both(
    make_config: Any, pg_url: str, tmp_path: Path
) -> None:
    """The same call repeated, alternating between replicas A and B: the loop is counted once
    across both (warned, then blocked, then the breaker trips), the tripped breaker refuses any
    call through either replica, and a reset through one frees the session on both."""
    await migrate_store(parse_state_url(pg_url), tmp_path)
    tools = "{profile: full, loop_detection: {enabled: true, warn_threshold: 3, critical_threshold: 5, global_circuit_breaker: 7}}"
    config_a = _config(make_config, pg_url, tmp_path / "a", tools)
    config_b = _config(make_config, pg_url, tmp_path / "b", tools)
    gate = Gate()
    gate.go.set()
    seen: list[str] = []
    async with (
        Orchestrator(config_a, backend=FakeBackend(gate.handle)) as orch_a,
        Orchestrator(config_b, backend=FakeBackend(gate.handle)) as orch_b,
        serving(create_app(config_a, orch_a)) as url_a,
        serving(create_app(config_b, orch_b)) as url_b,
        httpx.AsyncClient(headers=HEADERS, timeout=60) as client,
    ):
        for i in range(8):
            answer = await client.post(
                f"{(url_a, url_b)[i % 2]}/v1/sessions/agent:a:loop/calls",
                json={"tool": "exec", "args": {"command": "echo same"}},
            )
            body = answer.json()
            seen.append(
                "warn" if body["ok"] and body.get("warnings") else "ok" if body["ok"] else body["error"]["code"]
            )
        assert seen[:2] == ["ok", "ok"] and seen[2] == "warn" and seen[-1] == "BLOCKED", seen
        other = await client.post(
            f"{url_a}/v1/sessions/agent:a:loop/calls", json={"tool": "exec", "args": {"command": "echo other"}}
        )
        assert "circuit breaker" in other.json()["error"]["message"], other.text
        await orch_b.session("agent:a:loop", agent="a").reset_loops()
        freed = await client.post(
            f"{url_a}/v1/sessions/agent:a:loop/calls", json={"tool": "exec", "args": {"command": "echo other"}}
        )
        assert freed.json()["ok"], freed.text


@pytest.mark.anyio
async def test_an_edit_through_one_replica_knows_what_the_session_read_through_the_other(
    make_config: Any, pg_url: str, tmp_path: Path
) -> None:
    """The session reads a file through A; the file changes behind its back; an edit through B
    is refused (CONFLICT: B knows what the session saw through A). Read again through B, the
    edit through A goes (A knows what it saw through B)."""
    await migrate_store(parse_state_url(pg_url), tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("one\n")

    config_a, config_b = (_host_config(make_config, pg_url, ws, tmp_path / r, "{profile: full}") for r in "ab")
    async with (
        Orchestrator(config_a, backend=FakeBackend(lambda _call: exec_result())) as orch_a,
        Orchestrator(config_b, backend=FakeBackend(lambda _call: exec_result())) as orch_b,
        serving(create_app(config_a, orch_a)) as url_a,
        serving(create_app(config_b, orch_b)) as url_b,
        httpx.AsyncClient(headers=HEADERS, timeout=60) as client,
    ):

        async def call(url: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
            answer = await client.post(f"{url}/v1/sessions/agent:a:f/calls", json={"tool": tool, "args": args})
            body: dict[str, Any] = answer.json()
            return body

        assert (await call(url_a, "read", {"path": "f.txt"}))["ok"]
        (ws / "f.txt").write_text("one, changed behind its back\n")
        refused = await call(url_b, "edit", {"path": "f.txt", "old_string": "one", "new_string": "two"})
        assert refused["error"]["code"] == "CONFLICT", refused
        assert (await call(url_b, "read", {"path": "f.txt"}))["ok"]
        done = await call(url_a, "edit", {"path": "f.txt", "old_string": "one", "new_string": "two"})
        assert done["ok"], done
    assert (ws / "f.txt").read_text() == "two, changed behind its back\n"


@pytest.mark.anyio
async def test_a_sub_agent_spawned_through_one_replica_is_known_messaged_and_closed_through_the_other(
    make_config: Any, pg_url: str, tmp_path: Path
) -> None:
    """The sessions registry in the store: a child spawned through A is listed through B, a
    message sent through B is in its inbox through A, the parent's fan-out is counted across
    both (max_children 2: a third spawn through B is refused), and closing the parent through
    B closes the child A spawned."""
    await migrate_store(parse_state_url(pg_url), tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()

    config_a, config_b = (
        _host_config(
            make_config, pg_url, ws, tmp_path / r, "{profile: full, subagents: {max_spawn_depth: 2, max_children: 2}}"
        )
        for r in "ab"
    )
    parent = "agent:a:boss"
    async with (
        Orchestrator(config_a, backend=FakeBackend(lambda _call: exec_result())) as orch_a,
        Orchestrator(config_b, backend=FakeBackend(lambda _call: exec_result())) as orch_b,
        serving(create_app(config_a, orch_a)) as url_a,
        serving(create_app(config_b, orch_b)) as url_b,
        httpx.AsyncClient(headers=HEADERS, timeout=60) as client,
    ):

        async def call(url: str, session: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
            answer = await client.post(f"{url}/v1/sessions/{session}/calls", json={"tool": tool, "args": args})
            body: dict[str, Any] = answer.json()
            return body

        spawned = await call(url_a, parent, "sessions_spawn", {"task": "look", "name": "scout"})
        assert spawned["ok"], spawned
        child = spawned["output"]["session"]
        listed = await call(url_b, parent, "sessions_list", {})
        assert child in str(listed["output"]), listed
        sent = await call(url_b, parent, "sessions_send", {"session": child, "text": "hello from B"})
        assert sent["ok"], sent
        history = await call(url_a, parent, "sessions_history", {"session": child})
        assert "hello from B" in str(history["output"]), history
        assert (await call(url_b, parent, "sessions_spawn", {"task": "t", "name": "two"}))["ok"]
        third = await call(url_b, parent, "sessions_spawn", {"task": "t", "name": "three"})
        assert third["error"]["code"] == "QUOTA_EXCEEDED", third  # A's child counted on B
        closed = await client.delete(f"{url_b}/v1/sessions/{parent}")
        assert closed.status_code == 200, closed.text
        assert orch_a.sessions.lineage(child).status == "closed"
