"""Two real `sandbox serve` replicas on one PostgreSQL and one engine, driven through HTTP: a
replica killed with -9 mid-call has its running calls taken over by the other within the lease
(engine/handover.py's adopt_orphans): a durable exec is adopted and its true outcome recorded,
nothing runs twice; any other call is ended and what it started is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sandbox.config.state import parse_state_url
from sandbox.journal.store import Journal
from sandbox.state.admin import migrate_store
from tests.conftest import RUN_ID
from tests.service_helpers import TOKEN_A, free_port, remove_instance, sha, wait_healthy

pytestmark = [pytest.mark.docker, pytest.mark.postgres, pytest.mark.usefixtures("images")]

A = {"Authorization": f"Bearer {TOKEN_A}"}
LEASE_S = 6


@pytest.fixture(autouse=True)
def _sandboxes_go() -> Iterator[None]:
    """The replicas' session sandboxes outlive the killed and stopped services: they go here."""
    yield
    remove_instance(f"rep{RUN_ID}")


def _config(tmp_path: Path, name: str, pg_url: str, ws: Path, extra: str = "") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "sandbox.yaml"
    path.write_text(f"""
state_dir: {folder / "state"}
instance: rep{RUN_ID}
state: {{url: '{pg_url}', lease_s: {LEASE_S}}}
tenants: [{{id: acme, quotas: {{max_concurrent_calls: 2}}, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]
{extra}
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: rw}}}}
  list: [{{id: alpha, tenant: acme, workspace: {ws}}}]
""")
    return path


def _start(cfg: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    with (cfg.parent / "serve.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "--config", str(cfg), "serve", "--port", str(port), "--grace", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, seconds=60, gone=lambda: None if proc.poll() is None else "exited")
    return url, proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=60)


def _runs(ws: Path, name: str) -> list[str]:
    path = ws / name
    return path.read_text().split() if path.exists() else []


def _until(what: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def test_a_replica_killed_mid_call_has_its_calls_taken_over_by_the_other(tmp_path: Path, pg_url: str) -> None:
    anyio.run(migrate_store, parse_state_url(pg_url), tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    url_a, proc_a = _start(_config(tmp_path, "a", pg_url, ws))
    url_b, proc_b = _start(_config(tmp_path, "b", pg_url, ws))
    try:
        durable = httpx.post(
            f"{url_a}/v1/sessions/agent:alpha:r1/calls",
            headers={**A, "Prefer": "respond-async"},
            json={"tool": "exec", "args": {"command": "echo start >> d.txt; sleep 5; echo done >> d.txt; echo done"}},
            timeout=60,
        )
        assert durable.status_code == 202, durable.text
        call_id = durable.headers["Location"].rsplit("/", 1)[1]
        _until(lambda: _runs(ws, "d.txt") == ["start"])
        killed = time.monotonic()
        proc_a.send_signal(signal.SIGKILL)
        proc_a.wait(timeout=30)
        found = httpx.get(f"{url_b}/v1/calls/{call_id}", params={"wait": 60}, headers=A, timeout=90).json()
        assert found["state"] == "finished", found  # B adopted it and recorded its true outcome
        assert found["result"]["ok"] is True and found["result"]["output"]["output"] == "done\n", found
        assert time.monotonic() - killed < 5 + 3 * LEASE_S  # within the lease (and the command's own time)
        assert _runs(ws, "d.txt") == ["start", "done"]  # once
    finally:
        _stop(proc_a)
        _stop(proc_b)
    # A's journal shows the start; B's own journal shows the adoption and the outcome
    a_stages = _stages(tmp_path / "a", call_id)
    b_stages = _stages(tmp_path / "b", call_id)
    assert "durable_started" in a_stages and "finished" not in a_stages, a_stages
    assert b_stages[:1] == ["adopted"] and b_stages[-1] == "finished", b_stages


@pytest.mark.parametrize("restart", ["while_b_runs_it", "after_b_finished_it"])
def test_a_replica_restarting_after_another_adopted_its_call_leaves_it_be(
    tmp_path: Path, pg_url: str, restart: str
) -> None:
    """A hands a call over as it stops (SIGTERM, `service.handover`); B adopts it at once (A
    dropped its lease); A starts again and finds the call open in its journal: B holds the
    record (or recorded its outcome already), so A lets it go (`adopted_elsewhere`) and never
    kills the command B waits for."""
    anyio.run(migrate_store, parse_state_url(pg_url), tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    cfg_a = _config(tmp_path, "a", pg_url, ws)
    cfg_a.write_text(cfg_a.read_text() + "service: {handover: true}\n")
    url_a, proc_a = _start(cfg_a)
    url_b, proc_b = _start(_config(tmp_path, "b", pg_url, ws))
    again = None
    try:
        durable = httpx.post(
            f"{url_a}/v1/sessions/agent:alpha:r2/calls",
            headers={**A, "Prefer": "respond-async"},
            json={"tool": "exec", "args": {"command": "echo start >> h.txt; sleep 8; echo done >> h.txt; echo done"}},
            timeout=60,
        )
        assert durable.status_code == 202, durable.text
        call_id = durable.headers["Location"].rsplit("/", 1)[1]
        _until(lambda: _runs(ws, "h.txt") == ["start"])
        proc_a.send_signal(signal.SIGTERM)
        proc_a.wait(timeout=60)
        _until(lambda: "adopted" in _stages(tmp_path / "b", call_id), seconds=30)
        if restart == "while_b_runs_it":
            _url_a2, again = _start(cfg_a)
        found = httpx.get(f"{url_b}/v1/calls/{call_id}", params={"wait": 60}, headers=A, timeout=90).json()
        assert found["state"] == "finished" and found["result"]["output"]["output"] == "done\n", found
        if restart == "after_b_finished_it":  # A comes back after B recorded the outcome
            _url_a2, again = _start(cfg_a)
            _until(lambda: _stages(tmp_path / "a", call_id)[-1:] == ["adopted_elsewhere"], seconds=60)
    finally:
        for proc in (proc_a, proc_b, again):
            if proc is not None:
                _stop(proc)
    assert _runs(ws, "h.txt") == ["start", "done"]  # never killed, once
    a_stages = _stages(tmp_path / "a", call_id)
    assert "handed_over" in a_stages and a_stages[-1] == "adopted_elsewhere", a_stages


def _workspace(tmp_path: Path, pg_url: str) -> Path:
    anyio.run(migrate_store, parse_state_url(pg_url), tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    return ws


def test_an_approval_waiting_on_one_replica_is_decided_through_the_other(tmp_path: Path, pg_url: str) -> None:
    """A call needing approval waits on A; B lists it and approves it; A's call runs at once."""
    ws = _workspace(tmp_path, pg_url)
    approvals = "tools: {approvals: {require: [exec], timeout_s: 120}}"
    url_a, proc_a = _start(_config(tmp_path, "a", pg_url, ws, approvals))
    url_b, proc_b = _start(_config(tmp_path, "b", pg_url, ws, approvals))
    try:
        submitted = httpx.post(
            f"{url_a}/v1/sessions/agent:alpha:r3/calls",
            headers={**A, "Prefer": "respond-async"},
            json={"tool": "exec", "args": {"command": "echo approved-run >> ap.txt; echo ran"}},
            timeout=60,
        )
        assert submitted.status_code == 202, submitted.text
        call_id = submitted.headers["Location"].rsplit("/", 1)[1]
        pending: list[Any] = []

        def listed() -> bool:
            pending[:] = httpx.get(f"{url_b}/v1/approvals", headers=A, timeout=30).json()
            return bool(pending)

        _until(listed)
        assert pending[0]["tool"] == "exec" and _runs(ws, "ap.txt") == []  # nothing ran before the decision
        decided = httpx.post(f"{url_b}/v1/approvals/{pending[0]['id']}/approve", headers=A, json={}, timeout=30)
        assert decided.status_code == 200, decided.text
        found = httpx.get(f"{url_a}/v1/calls/{call_id}", params={"wait": 60}, headers=A, timeout=90).json()
        assert found["state"] == "finished" and found["result"]["ok"], found
        assert _runs(ws, "ap.txt") == ["approved-run"]
    finally:
        _stop(proc_a)
        _stop(proc_b)


def test_a_burst_split_across_two_replicas_never_passes_the_tenants_quota(tmp_path: Path, pg_url: str) -> None:
    """Eight calls at once, four to each replica, under `max_concurrent_calls: 2`: two run,
    six are refused with 429 naming the quota; the commands' own record shows at most two at once."""
    ws = _workspace(tmp_path, pg_url)
    url_a, proc_a = _start(_config(tmp_path, "a", pg_url, ws))
    url_b, proc_b = _start(_config(tmp_path, "b", pg_url, ws))
    answers: list[int] = []
    try:

        async def burst() -> None:
            command = "echo in >> burst.txt; sleep 3; echo out >> burst.txt"
            async with httpx.AsyncClient(headers=A, timeout=120) as client:

                async def one(url: str, n: int) -> None:
                    answer = await client.post(
                        f"{url}/v1/sessions/agent:alpha:b{n}/calls", json={"tool": "exec", "args": {"command": command}}
                    )
                    answers.append(answer.status_code)

                async with anyio.create_task_group() as group:
                    for n in range(8):
                        group.start_soon(one, url_a if n % 2 else url_b, n)

        anyio.run(burst)
    finally:
        _stop(proc_a)
        _stop(proc_b)
    assert sorted(answers) == [200, 200, 429, 429, 429, 429, 429, 429], answers
    most = now = 0
    for mark in _runs(ws, "burst.txt"):
        now += 1 if mark == "in" else -1
        most = max(most, now)
    assert most <= 2 and _runs(ws, "burst.txt").count("in") == 2


def _stages(folder: Path, call_id: str) -> list[str]:
    journal = Journal(folder / "state" / "journal.sqlite3")
    try:
        return [e.stage for e in journal.events(call_id=call_id)]
    finally:
        journal.close()


def test_a_call_on_one_replica_is_in_the_others_logs_and_event_stream(tmp_path: Path, pg_url: str) -> None:
    """A session's event stream opened on B shows a call running on A as it happens (relayed by
    NOTIFY), and B's /v1/logs holds the call's journal (A's journal, shipped to the store)."""
    import json
    import threading

    ws = _workspace(tmp_path, pg_url)
    url_a, proc_a = _start(_config(tmp_path, "a", pg_url, ws))
    url_b, proc_b = _start(_config(tmp_path, "b", pg_url, ws))
    streamed: list[dict[str, Any]] = []
    connected = threading.Event()

    def follow() -> None:
        with httpx.stream("GET", f"{url_b}/v1/sessions/agent:alpha:r5/events", headers=A, timeout=60) as stream:
            for line in stream.iter_lines():
                if line.startswith(": connected"):
                    connected.set()
                if line.startswith("data: "):
                    streamed.append(json.loads(line[6:]))
                    if streamed[-1]["kind"] == "finished":
                        return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        assert connected.wait(30)
        done = httpx.post(
            f"{url_a}/v1/sessions/agent:alpha:r5/calls",
            headers=A,
            json={"tool": "exec", "args": {"command": "sleep 1.5; echo from-a"}},
            timeout=60,
        )
        assert done.status_code == 200 and done.json()["ok"], done.text
        call_id = done.json()["call_id"]
        follower.join(30)
        kinds = [e["kind"] for e in streamed if e["call_id"] == call_id]
        assert kinds[0] == "queued" and "started" in kinds and "running" in kinds and kinds[-1] == "finished", kinds
        logs: list[dict[str, Any]] = []

        def shipped() -> bool:
            logs[:] = httpx.get(f"{url_b}/v1/logs", params={"session": "agent:alpha:r5"}, headers=A, timeout=30).json()
            return any(e["call_id"] == call_id and e["stage"] == "finished" for e in logs)

        _until(shipped, 30)
        stages = [e["stage"] for e in reversed(logs) if e["call_id"] == call_id]
        assert stages[0] == "proposed" and "running" in stages and stages[-1] == "finished", stages
        assert {e["tenant"] for e in logs} == {"acme"}
    finally:
        _stop(proc_a)
        _stop(proc_b)


def test_an_unkeyed_call_of_a_killed_replica_is_settled_by_the_other_and_its_command_killed(
    tmp_path: Path, pg_url: str
) -> None:
    """A plain call (no key, not submitted) runs `sleep` on A; A is killed with -9. B finds the
    call's record, whose owner is gone, within the lease: it kills the command in the sandbox
    and records the call abandoned (in the shared logs). Nothing of it is left running."""
    import threading

    ws = _workspace(tmp_path, pg_url)
    url_a, proc_a = _start(_config(tmp_path, "a", pg_url, ws))
    url_b, proc_b = _start(_config(tmp_path, "b", pg_url, ws))
    session = "agent:alpha:r6"

    def plain_call() -> None:
        with __import__("contextlib").suppress(httpx.HTTPError):  # A dies under it
            httpx.post(
                f"{url_a}/v1/sessions/{session}/calls",
                headers=A,
                json={"tool": "exec", "args": {"command": "echo start >> u.txt; sleep 40; echo done >> u.txt"}},
                timeout=60,
            )

    caller = threading.Thread(target=plain_call, daemon=True)
    try:
        caller.start()
        _until(lambda: _runs(ws, "u.txt") == ["start"])
        killed = time.monotonic()
        proc_a.send_signal(signal.SIGKILL)
        proc_a.wait(timeout=30)
        stages: list[dict[str, Any]] = []

        def settled() -> bool:
            logs = httpx.get(f"{url_b}/v1/logs", params={"session": session}, headers=A, timeout=30).json()
            stages[:] = [e for e in logs if e["tool"] == "exec"]
            return any(e["stage"] == "abandoned" for e in stages)

        _until(settled, 5 * LEASE_S)
        assert time.monotonic() - killed < 5 * LEASE_S
        abandoned = next(e for e in stages if e["stage"] == "abandoned")
        assert "went away" in abandoned["data"]["reason"], abandoned
        left = httpx.post(
            f"{url_b}/v1/sessions/{session}/calls",
            headers=A,
            json={"tool": "exec", "args": {"command": "pgrep -f 'slee[p] 40' || echo none"}},
            timeout=60,
        ).json()
        assert left["ok"] and left["output"]["output"].strip() == "none", left  # the command was killed
        assert _runs(ws, "u.txt") == ["start"]
    finally:
        _stop(proc_a)
        _stop(proc_b)
        caller.join(10)


def test_sessions_of_a_shared_container_keep_one_uid_each_whichever_replica_runs_them(
    tmp_path: Path, pg_url: str
) -> None:
    """An agent-scope container that sessions share gives each session a uid of its own. With
    two replicas (each its own state dir), the uids come from the store: session s1 through A
    and s2 through B never get one uid, s1 has the same uid through B, and what s1 keeps to
    itself s2 cannot read through either replica."""
    ws = _workspace(tmp_path, pg_url)
    configs = []
    for name in ("a", "b"):
        cfg = _config(tmp_path, name, pg_url, ws)
        text = cfg.read_text().replace("scope: session, workspace_access: rw", "scope: agent, workspace_access: ro")
        cfg.write_text(text)
        configs.append(cfg)
    url_a, proc_a = _start(configs[0])
    url_b, proc_b = _start(configs[1])

    def run(url: str, session: str, command: str) -> dict[str, Any]:
        answer = httpx.post(
            f"{url}/v1/sessions/agent:alpha:{session}/calls",
            headers=A,
            json={"tool": "exec", "args": {"command": command}},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        assert body["ok"], body
        return body

    try:
        s1_a = run(url_a, "u1", "id -u")["output"]["output"].strip()
        s2_b = run(url_b, "u2", "id -u")["output"]["output"].strip()
        s1_b = run(url_b, "u1", "id -u")["output"]["output"].strip()
        assert int(s1_a) >= 20000 and s1_a != s2_b and s1_a == s1_b, (s1_a, s2_b, s1_b)
        # what s1 made through A, s2 cannot change through B (another uid; the workspace is read-only)
        run(url_a, "u1", "echo mine > /tmp/u1-note && chmod 600 /tmp/u1-note")
        refused = httpx.post(
            f"{url_b}/v1/sessions/agent:alpha:u2/calls",
            headers=A,
            json={"tool": "exec", "args": {"command": "cat /tmp/u1-note"}},
            timeout=120,
        ).json()
        assert "Permission denied" in str(refused), refused
        assert run(url_b, "u1", "cat /tmp/u1-note")["output"]["output"] == "mine\n"
    finally:
        _stop(proc_a)
        _stop(proc_b)


def test_two_replicas_never_hand_one_warm_pool_container_to_two_sessions(tmp_path: Path, pg_url: str) -> None:
    """A warm pool on one engine, two replicas (each its claim files in its own state dir). A
    starts first and fills the pool; B, started after, finds it full and makes none, so its
    sessions claim A's members from the engine's list while A hands the same members to its
    own: six new sessions at once, three through each, each gets a container of its own (a
    mark one session leaves in its /tmp is never found by another)."""
    ws = _workspace(tmp_path, pg_url)
    configs = []
    for name in ("a", "b"):
        cfg = _config(tmp_path, name, pg_url, ws)
        text = cfg.read_text().replace("max_concurrent_calls: 2", "max_concurrent_calls: 20")
        text = text.replace("workspace_access: rw}", "workspace_access: rw, pool: {size: 3}}")
        cfg.write_text(text)
        configs.append(cfg)
    url_a, proc_a = _start(configs[0])
    time.sleep(6)  # A fills the pool
    url_b, proc_b = _start(configs[1])
    answers: list[str] = []
    try:
        time.sleep(2)  # B sees the pool full: it makes no member of its own

        async def burst() -> None:
            async with httpx.AsyncClient(headers=A, timeout=180) as client:

                async def one(url: str, n: int) -> None:
                    command = f"if [ -e /tmp/mark ]; then cat /tmp/mark; else echo p{n} > /tmp/mark; echo fresh; fi"
                    r = await client.post(
                        f"{url}/v1/sessions/agent:alpha:p{n}/calls", json={"tool": "exec", "args": {"command": command}}
                    )
                    assert r.status_code == 200 and r.json()["ok"], r.text
                    answers.append(r.json()["output"]["output"].strip())

                async with anyio.create_task_group() as group:
                    for n in range(6):
                        group.start_soon(one, url_a if n % 2 else url_b, n)

        anyio.run(burst)
        import docker

        from sandbox.runtime.naming import Labels

        client = docker.from_env()
        try:
            members = client.containers.list(
                all=True, filters={"label": [f"{Labels.INSTANCE}=rep{RUN_ID}", Labels.POOL]}
            )
            handed = [c.name for c in members if "-pool-" not in c.name]
        finally:
            client.close()
    finally:
        _stop(proc_a)
        _stop(proc_b)
    assert answers == ["fresh"] * 6, answers
    assert handed, "no session got a pool member: the pool was not exercised"


def test_a_process_started_through_one_replica_is_polled_and_killed_through_the_other(
    tmp_path: Path, pg_url: str
) -> None:
    """`exec` with `background` through A, then `process` through B: B lists it, polls its
    output to the end, and a second one started through B is killed through A."""
    ws = _workspace(tmp_path, pg_url)
    url_a, proc_a = _start(_config(tmp_path, "a", pg_url, ws))
    url_b, proc_b = _start(_config(tmp_path, "b", pg_url, ws))

    def call(url: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        answer = httpx.post(
            f"{url}/v1/sessions/agent:alpha:r7/calls", headers=A, json={"tool": tool, "args": args}, timeout=120
        )
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    try:
        started = call(url_a, "exec", {"command": "echo one; sleep 1; echo two", "background": True})
        assert started["ok"], started
        first = started["output"]["process_id"]
        listed = call(url_b, "process", {"action": "list"})
        assert [p["id"] for p in listed["output"]["processes"]] == [first], listed
        seen: list[str] = []

        def done() -> bool:
            polled = call(url_b, "process", {"action": "poll", "id": first})
            assert polled["ok"], polled
            seen.append(polled["output"]["output"])
            return bool(polled["output"]["status"] == "exited")

        _until(done, 30)
        assert "".join(seen) == "one\ntwo\n"  # each byte once: the offset is shared too
        second = call(url_b, "exec", {"command": "sleep 60", "background": True})["output"]["process_id"]
        killed = call(url_a, "process", {"action": "kill", "id": second})
        assert killed["ok"], killed
        left = call(url_a, "exec", {"command": "pgrep -f 'slee[p] 60' || echo none"})
        assert left["output"]["output"].strip() == "none", left
    finally:
        _stop(proc_a)
        _stop(proc_b)
