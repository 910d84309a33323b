"""What the service keeps between requests so that a call costs little: session handles, the
tenants' tokens and agents, one watcher for all calls. Each must stay correct when things change."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sandbox import Orchestrator, load_config_text
from tests.service_helpers import TOKEN_A, TOKEN_B, serve, sha

A = {"Authorization": f"Bearer {TOKEN_A}"}


def config(tmp_path: Path, extra: str = "") -> Any:
    return load_config_text(f"""
state_dir: {tmp_path / "state"}
tools: {{profile: full}}
{extra}
tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, allow_unsandboxed: true}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: alpha, tenant: acme, default: true, workspace: "{tmp_path / "wa"}"}}
    - {{id: omega, tenant: acme, workspace: "{tmp_path / "wo"}"}}
    - {{id: beta, tenant: globex, workspace: "{tmp_path / "wb"}"}}
""")


def test_a_session_handle_is_reused_until_the_session_closes(tmp_path: Path) -> None:
    """The same identity gets the same handle (its file states and shell made once); another
    sender, provider or agent gets its own; a closed session's next handle is a new one."""

    async def main() -> None:
        async with Orchestrator(config(tmp_path), journal=False) as orch:
            first = orch.session("agent:alpha:s")
            assert orch.session("agent:alpha:s") is first
            assert orch.session("agent:alpha:s", sender="bob") is not first
            assert orch.session("agent:alpha:s", provider="openai") is not first
            assert orch.session("agent:alpha:other") is not first
            assert (await first.call("write", {"path": "f.txt", "content": "one"})).ok
            assert (await first.call("read", {"path": "f.txt"})).ok
            await first.close()
            after = orch.session("agent:alpha:s")
            assert after is not first
            # what the old handle knew about the file does not leak into the new one
            assert (await after.call("read", {"path": "f.txt"})).ok

    anyio.run(main)


def test_session_handles_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service that sees many sessions keeps only the most recently used handles."""
    import sandbox.engine.orchestrator as orchestrator_module

    monkeypatch.setattr(orchestrator_module, "SESSION_HANDLES", 3)

    async def main() -> None:
        async with Orchestrator(config(tmp_path), journal=False) as orch:
            kept = orch.session("agent:alpha:keep")
            for i in range(5):
                orch.session(f"agent:alpha:s{i}")
                orch.session("agent:alpha:keep")  # used again: stays
            assert orch.session("agent:alpha:keep") is kept
            assert len(orch._handles) == 3

    anyio.run(main)


def test_tokens_written_while_serving_take_effect_and_removed_ones_stop(tmp_path: Path) -> None:
    """The tenants' token file is read again when it changes: a new token works at once, and a
    token removed from the file is refused at once (the cache is keyed on the file's identity)."""
    from sandbox.api.tenants import TOKEN_FILE, Tenants, create_token

    cfg = config(tmp_path)
    tenants = Tenants(cfg)
    assert tenants.from_authorization(f"Bearer {TOKEN_A}") is not None
    assert tenants.from_authorization(f"Bearer {TOKEN_B}") is None
    token = create_token(cfg, "globex", "laptop")
    who = tenants.from_authorization(f"Bearer {token}")
    assert who is not None and who.tenant.id == "globex" and who.token_name == "laptop"
    path = cfg.state_dir / TOKEN_FILE
    path.write_text(json.dumps([]))  # revoked, in the same tick as the write before
    assert tenants.from_authorization(f"Bearer {token}") is None
    path.write_text("not json")
    assert tenants.from_authorization(f"Bearer {token}") is None
    assert tenants.from_authorization(f"Bearer {TOKEN_A}") is not None  # the config's stay


def test_the_tenant_directory_keeps_tenants_apart(tmp_path: Path) -> None:
    """Cached agents are per tenant: the default first, another tenant's agent absent."""
    from sandbox.api.tenants import Tenants

    tenants = Tenants(config(tmp_path))
    assert list(tenants.agents("acme")) == ["alpha", "omega"]
    assert "beta" not in tenants.agents("acme")
    default = tenants.default_agent("globex")
    assert default is not None and default.id == "beta"
    assert tenants.default_agent("nobody") is None


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_one_watcher_stops_only_the_calls_it_is_told_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call whose condition says stop is cancelled (None); the others finish with their value;
    a condition that raises is logged and does not end the watch; errors of the work propagate."""
    import sandbox.api.serving as serving

    monkeypatch.setattr(serving, "STOP_POLL_S", 0.01)
    watch = serving.StopWatch()
    ended: list[str] = []

    async def work(name: str, seconds: float) -> str:
        try:
            await anyio.sleep(seconds)
            return name
        finally:
            ended.append(name)

    async def failing() -> str:
        raise ValueError("the work's own error")

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        stop_now = False

        async def stop_a() -> bool:
            return stop_now

        async def never() -> bool:
            return False

        async def broken() -> bool:
            raise OSError("a connection that cannot be asked")

        async def run(name: str, stop: Any, seconds: float) -> None:
            out[name] = await watch.until_stopped(stop, work(name, seconds))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run)
            tg.start_soon(run, "a", stop_a, 30)
            tg.start_soon(run, "b", never, 0.3)
            tg.start_soon(run, "c", broken, 0.3)
            await anyio.sleep(0.1)
            assert watch.watching() == 3
            stop_now = True
            await anyio.sleep(0.5)
            with pytest.raises(ValueError, match="own error"):
                await watch.until_stopped(never, failing())
            assert watch.watching() == 0
            tg.cancel_scope.cancel()
        return out

    out = anyio.run(main)
    assert out == {"a": None, "b": "b", "c": "c"}
    assert sorted(ended) == ["a", "b", "c"]


@pytest.mark.slow
def test_metrics_show_calls_waiting_in_the_queue(tmp_path: Path) -> None:
    """`sandbox_queue_depth` is the number of calls waiting for a slot: 1 while a second call
    waits behind a running one, 0 once both are done."""
    cfg = config(tmp_path, "limits: {global_concurrency: 1, tenant_concurrency: 1}")
    (tmp_path / "wa").mkdir()
    (tmp_path / "wa" / "f.txt").write_text("x")
    answers: list[httpx.Response] = []

    def depth(url: str) -> float:
        for line in httpx.get(f"{url}/metrics").text.splitlines():
            if line.startswith("sandbox_queue_depth "):
                return float(line.split()[1])
        raise AssertionError("no sandbox_queue_depth in /metrics")

    with serve(cfg) as url:
        assert depth(url) == 0

        def call(key: str, tool: str, args: dict[str, Any]) -> None:
            answers.append(
                httpx.post(f"{url}/v1/sessions/{key}/calls", headers=A, json={"tool": tool, "args": args}, timeout=60)
            )

        slow = threading.Thread(target=call, args=("agent:alpha:q1", "exec", {"command": "sleep 1"}))
        slow.start()
        time.sleep(0.3)
        waiting = threading.Thread(target=call, args=("agent:alpha:q2", "read", {"path": "f.txt"}))
        waiting.start()
        seen = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and 1.0 not in seen:
            seen.append(depth(url))
            time.sleep(0.05)
        slow.join(30)
        waiting.join(30)
        assert 1.0 in seen, seen
        assert depth(url) == 0
    assert [r.status_code for r in answers] == [200, 200]
    assert all(r.json()["ok"] for r in answers), [r.text for r in answers]


def test_file_states_of_two_handles_do_not_drop_each_others_entries(tmp_path: Path) -> None:
    """Two holders of one session's file states (two processes on the state dir, or two handles):
    what one records survives the other's next write."""
    from sandbox.fs.states import FileStates

    async def main() -> None:
        path = tmp_path / "file-states.json"
        one, two = FileStates(path), FileStates(path)
        await one.record("f", b"first", 1)
        await two.record("g", b"other", 2)
        await one.record("f", b"first, changed", 3)
        assert {json.loads(line)["k"] for line in path.read_text().splitlines()} == {"f", "g"}
        assert await two.get("f") is not None and await one.get("g") is not None

    anyio.run(main)


def test_closing_forgets_every_handle_of_the_session(tmp_path: Path) -> None:
    async def main() -> None:
        async with Orchestrator(config(tmp_path), journal=False) as orch:
            plain = orch.session("agent:alpha:s")
            bobs = orch.session("agent:alpha:s", sender="bob")
            await plain.close()
            assert orch.session("agent:alpha:s", sender="bob") is not bobs

    anyio.run(main)


@pytest.mark.slow
def test_a_host_workspace_removed_between_calls_is_made_again(tmp_path: Path) -> None:
    """The reused handle does not assume its workspace still exists."""
    import shutil

    async def main() -> None:
        async with Orchestrator(config(tmp_path), journal=False) as orch:
            session = orch.session("agent:alpha:s")
            assert (await session.call("write", {"path": "a.txt", "content": "a"})).ok
            shutil.rmtree(tmp_path / "wa")
            again = await session.call("write", {"path": "b.txt", "content": "b"})
            assert again.ok, again.error
            ran = await session.call("exec", {"command": "ls"})
            assert ran.ok and "b.txt" in ran.output["output"], ran

    anyio.run(main)


@pytest.mark.slow
def test_bodies_that_are_not_json_are_4xx_and_not_echoed(tmp_path: Path) -> None:
    """Bytes that are not UTF-8, a large body that is not JSON, and a body sent as text/plain are
    each a 422 (never a 500), and the answer does not repeat the body."""
    cfg = config(tmp_path)
    with serve(cfg) as url:
        calls = f"{url}/v1/sessions/agent:alpha:s/calls"
        bad_bytes = httpx.post(calls, headers={**A, "content-type": "application/json"}, content=b'{"tool":"\xff"}')
        assert bad_bytes.status_code == 422, bad_bytes.text
        big = b"{" + b"x" * 1_000_000
        refused = httpx.post(calls, headers={**A, "content-type": "application/json"}, content=big)
        assert refused.status_code == 422 and len(refused.content) < 2_000, len(refused.content)
        as_text = httpx.post(
            calls, headers={**A, "content-type": "text/plain"}, content=b'{"tool": "read", "args": {"path": "x"}}'
        )
        assert as_text.status_code == 422 and "must be JSON" in as_text.text
        fine = httpx.post(calls, headers=A, json={"tool": "write", "args": {"path": "x.txt", "content": "1"}})
        assert fine.status_code == 200 and fine.json()["ok"], fine.text


@pytest.mark.slow
def test_a_client_gone_before_its_body_arrived_is_no_server_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that sends headers and half its body, then closes, costs no traceback (it was a
    500 in the server's log once the route read its own body); the next client is served."""
    import logging
    import socket
    from urllib.parse import urlparse

    cfg = config(tmp_path)
    uvicorn_log = logging.getLogger("uvicorn.error")  # uvicorn's loggers do not propagate to the root
    with serve(cfg) as url, caplog.at_level(logging.ERROR):
        uvicorn_log.addHandler(caplog.handler)  # after uvicorn configured its logging
        where = urlparse(url)
        for _ in range(2):
            with socket.create_connection((where.hostname, where.port)) as conn:
                conn.sendall(
                    b"POST /v1/sessions/agent:alpha:s/calls HTTP/1.1\r\nHost: x\r\n"
                    + f"Authorization: Bearer {TOKEN_A}\r\n".encode()
                    + b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"tool": '
                )
                time.sleep(0.3)  # the route waits for the rest of the body when the client goes
        time.sleep(0.2)
        fine = httpx.post(
            f"{url}/v1/sessions/agent:alpha:s/calls",
            headers=A,
            json={"tool": "write", "args": {"path": "y", "content": ""}},
        )
        assert fine.status_code == 200, fine.text
    uvicorn_log.removeHandler(caplog.handler)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.slow
def test_metrics_need_a_metrics_token_once_one_is_configured(tmp_path: Path) -> None:
    """/metrics names every tenant: with service.metrics_tokens set it needs one of them; a
    tenant's valid token is refused like no token at all."""
    scraper = "sbx_metrics-scraper-token"
    cfg = config(tmp_path, f"service: {{metrics_tokens: [{{name: prom, sha256: {sha(scraper)}}}]}}")
    with serve(cfg) as url:
        for headers in ({}, A, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {scraper}"}):
            refused = httpx.get(f"{url}/metrics", headers=headers)
            assert refused.status_code == 401 and "acme" not in refused.text, refused.text
        scraped = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {scraper}"})
        assert scraped.status_code == 200 and "sandbox_queue_depth" in scraped.text
    with serve(config(tmp_path / "open")) as url:  # none configured: open, as documented
        assert httpx.get(f"{url}/metrics").status_code == 200
