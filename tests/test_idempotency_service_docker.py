"""`Idempotency-Key` through a real `sandbox serve` process, calls in real sandboxes: a client that
drops its connection mid-call and retries with the key gets the first run's result (a counter
file the command appends to shows one run); twenty concurrent retries of one key run once; the
same key for another call is 422 naming the key; another tenant's key of the same name is its own."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.client import Client, ServiceError
from sandbox.errors import ErrorCode
from tests.service_helpers import TOKEN_A, TOKEN_B, serve_process, sha

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]
A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}


def _config_file(tmp_path: Path, instance: str) -> Path:
    path = tmp_path / "sandbox.yaml"
    path.write_text(f"""
state_dir: {tmp_path / "state"}
instance: {instance}
tenants:
  - {{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
    - {{id: alpha, tenant: acme, default: true}}
    - {{id: beta, tenant: globex}}
""")
    return path


def _post(url: str, headers: dict[str, str], command: str, key: str | None, timeout: float = 120) -> httpx.Response:
    extra = {"Idempotency-Key": key} if key is not None else {}
    return httpx.post(
        f"{url}/v1/sessions/work/calls",
        headers={**headers, **extra},
        json={"tool": "exec", "args": {"command": command, "timeout_s": 60}},
        timeout=timeout,
    )


def _output(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["ok"], body
    return str(body["output"]["output"]).strip()


def test_a_dropped_client_retries_with_its_key_and_the_command_ran_once(tmp_path: Path, instance: str) -> None:
    with serve_process(_config_file(tmp_path, instance)) as (url, _):
        slow = "sleep 3; echo ran >> count.txt; wc -l < count.txt"
        with pytest.raises(httpx.ReadTimeout):
            _post(url, A, slow, "drop-1", timeout=1.0)  # the client gives up and goes away
        assert _output(_post(url, A, slow, "drop-1")) == "1"  # the first run's result, waited for
        assert _output(_post(url, A, slow, "drop-1")) == "1"
        assert _output(_post(url, A, "wc -l < count.txt", None)) == "1"  # it ran once, to its end

        many = "sleep 1; echo ran >> many.txt; wc -l < many.txt"
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda _: _post(url, A, many, "many-1"), range(20)))
        assert {_output(r) for r in answers} == {"1"}
        assert len({r.json()["call_id"] for r in answers}) == 1
        assert _output(_post(url, A, "wc -l < many.txt", None)) == "1"

        other = _post(url, A, "echo something else", "drop-1")
        assert other.status_code == 422 and other.json()["idempotency_key"] == "drop-1", other.text
        (problem,) = other.json()["detail"]  # FastAPI's validation shape: the header is the bad input
        assert problem["loc"] == ["header", "Idempotency-Key"] and "another call" in problem["msg"]
        bad = _post(url, A, slow, "has space")
        assert bad.status_code == 422 and "idempotency key" in bad.json()["detail"][0]["msg"]

        # globex's key of the same name is its own call, in its own sandbox
        assert _output(_post(url, B, "echo ran >> count.txt; wc -l < count.txt", "drop-1")) == "1"

        # a batch with a key: each call once; a repeat gets the same results
        batch = {
            "mode": "sequential",
            "calls": [{"tool": "exec", "args": {"command": "echo ran >> b.txt; wc -l < b.txt"}} for _ in range(2)],
        }
        answers = [
            httpx.post(
                f"{url}/v1/sessions/work/batches", headers={**A, "Idempotency-Key": "batch-1"}, json=batch, timeout=120
            )
            for _ in range(2)
        ]
        assert [a.status_code for a in answers] == [200, 200], answers[0].text
        outputs = [[r["output"]["output"].strip() for r in a.json()["results"]] for a in answers]
        assert outputs == [["1", "2"], ["1", "2"]]
        too_long = httpx.post(
            f"{url}/v1/sessions/work/batches", headers={**A, "Idempotency-Key": "k" * 195}, json=batch, timeout=30
        )
        assert too_long.status_code == 422 and "190" in too_long.json()["detail"][0]["msg"]

        # the typed client sends the key the same way
        with Client(url, TOKEN_A) as client:
            session = client.session("work")
            once = session.call("exec", {"command": "echo ran >> c.txt; wc -l < c.txt"}, idempotency_key="c-1")
            twice = session.call("exec", {"command": "echo ran >> c.txt; wc -l < c.txt"}, idempotency_key="c-1")
            assert once.ok and twice.call_id == once.call_id and twice.output == once.output
            with pytest.raises(ServiceError) as refused:
                session.call("exec", {"command": "true"}, idempotency_key="c-1")
            assert refused.value.code == ErrorCode.INVALID_ARGUMENTS and refused.value.status == 422
            assert "'c-1'" in refused.value.message and "another call" in refused.value.message


def test_a_repeat_of_a_running_keyed_batch_waits_for_it_without_taking_quota(tmp_path: Path, instance: str) -> None:
    """Under max_concurrent_calls: 1, a keyed batch runs; its repeat (a client retrying) waits for
    that run instead of asking for a slot (which would be 429), and gets the same results."""
    path = tmp_path / "sandbox.yaml"
    path.write_text(f"""
state_dir: {tmp_path / "state"}
instance: {instance}
tenants:
  - {{id: acme, quotas: {{max_concurrent_calls: 1}}, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
    - {{id: alpha, tenant: acme, default: true}}
""")
    batch = {"calls": [{"tool": "exec", "args": {"command": "sleep 2; echo ran >> q.txt; wc -l < q.txt"}}]}
    headers = {**A, "Idempotency-Key": "slow-batch"}
    with serve_process(path) as (url, _), concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.post, f"{url}/v1/sessions/work/batches", headers=headers, json=batch, timeout=120)
        time.sleep(1.0)  # the first holds the tenant's one slot now
        repeat = httpx.post(f"{url}/v1/sessions/work/batches", headers=headers, json=batch, timeout=120)
        original = first.result()
        assert original.status_code == repeat.status_code == 200, (original.text, repeat.text)
        assert repeat.json()["results"] == original.json()["results"]
        assert _output(_post(url, A, "wc -l < q.txt", None)) == "1"
