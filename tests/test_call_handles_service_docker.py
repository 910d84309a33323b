"""Calls as handles through a real `sandbox serve` process, in real sandboxes: `Prefer:
respond-async` answers 202 with Location at once; `GET /v1/calls/{id}?wait=S` long-polls to the
ToolResult; `DELETE` cancels a running call (its command killed, the record naming the tenant);
another tenant's call id is 404, as one that never existed."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.service_helpers import TOKEN_A, TOKEN_B, serve_process
from tests.test_idempotency_service_docker import _config_file

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]
A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}
ASYNC = {"Prefer": "respond-async"}


def _submit(url: str, headers: dict[str, str], command: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/sessions/work/calls",
        headers={**headers, **ASYNC},
        json={"tool": "exec", "args": {"command": command, "timeout_s": 60}},
        timeout=30,
    )


def test_respond_async_answers_202_and_the_handle_long_polls_to_the_result(tmp_path: Path, instance: str) -> None:
    with serve_process(_config_file(tmp_path, instance)) as (url, _):
        started = time.monotonic()
        accepted = _submit(url, A, "sleep 2; echo handled")
        assert accepted.status_code == 202, accepted.text
        assert time.monotonic() - started < 2  # answered before the command ended
        call_id = accepted.json()["call_id"]
        assert accepted.headers["location"] == f"/v1/calls/{call_id}"
        early = httpx.get(f"{url}/v1/calls/{call_id}", headers=A, timeout=10).json()
        assert early["state"] in ("queued", "running") and early["result"] is None
        done = httpx.get(f"{url}{accepted.headers['location']}", params={"wait": 30}, headers=A, timeout=40).json()
        assert done["state"] == "finished" and done["result"]["output"]["output"].strip() == "handled"
        assert done["result"]["call_id"] == call_id
        # another tenant's id is no id at all; so is one that never existed
        assert httpx.get(f"{url}/v1/calls/{call_id}", headers=B, timeout=10).status_code == 404
        assert httpx.delete(f"{url}/v1/calls/{call_id}", headers=B, timeout=10).status_code == 404
        assert httpx.get(f"{url}/v1/calls/c_nope", headers=A, timeout=10).status_code == 404
        assert httpx.get(f"{url}/v1/calls/{call_id}", params={"wait": 61}, headers=A, timeout=10).status_code == 422


def test_delete_cancels_a_running_call_and_kills_its_command(tmp_path: Path, instance: str) -> None:
    with serve_process(_config_file(tmp_path, instance)) as (url, _):
        accepted = _submit(url, A, "echo started > started.txt; sleep 40; echo late > late.txt")
        call_id = accepted.json()["call_id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # its sandbox is made and the command runs
            state = httpx.get(f"{url}/v1/calls/{call_id}", headers=A, timeout=10).json()["state"]
            if state == "running":
                break
            time.sleep(0.2)
        time.sleep(1.5)
        cancelled = httpx.delete(f"{url}/v1/calls/{call_id}", headers=A, timeout=30)
        assert cancelled.status_code == 200, cancelled.text
        body = cancelled.json()
        assert body["state"] == "abandoned" and body["reason"] == "cancelled by tenant acme (token ci)"
        assert httpx.delete(f"{url}/v1/calls/{call_id}", headers=A, timeout=10).status_code == 409
        left = httpx.post(
            f"{url}/v1/sessions/work/calls",
            headers=A,
            json={"tool": "exec", "args": {"command": "pgrep -f 'slee[p] 40' || echo none; ls late.txt 2>&1"}},
        ).json()
        assert left["output"]["output"].split()[0] == "none" and "No such file" in left["output"]["output"]
