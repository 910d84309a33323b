"""The service with sandboxed sessions of two tenants, against the real engine: the same session key
in both tenants is two sessions and two containers; one tenant's process ids and files are not the
other's; closing a session over HTTP removes its container."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sandbox.runtime.naming import Labels
from tests.service_helpers import TOKEN_A, TOKEN_B, serve, sha

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}


def config(make_config: Any) -> Any:
    return make_config(f"""
tenants:
  - {{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
    - {{id: alpha, tenant: acme, default: true}}
    - {{id: beta, tenant: globex}}
""")


def call(url: str, headers: dict[str, str], key: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/sessions/{key}/calls", headers=headers, json={"tool": tool, "args": args}, timeout=120)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_one_key_two_tenants_two_sandboxes(make_config: Any, docker_client: Any, instance: str) -> None:
    """Key `work` in acme and in globex: different containers, files and process tables."""
    with serve(config(make_config)) as url:
        a = call(url, A, "work", "exec", {"command": "echo acme-secret > s.txt; hostname; cat /proc/1/cpuset"})
        b = call(url, B, "work", "exec", {"command": "cat s.txt 2>&1; hostname"})
        assert a["ok"] and b["ok"], (a, b)
        assert "No such file" in b["output"]["output"] and "acme-secret" not in b["output"]["output"]
        bg = call(url, A, "work", "exec", {"command": "sleep 60", "background": True})
        proc_id = bg["output"]["process_id"]
        poked = call(url, B, "work", "process", {"action": "kill", "id": proc_id})
        assert poked["error"] is not None and "no process" in poked["error"]["message"]
        polled = call(url, A, "work", "process", {"action": "poll", "id": proc_id})
        assert polled["output"]["status"] == "running"

        def agents_with_work() -> list[str]:
            found = docker_client.containers.list(filters={"label": f"{Labels.INSTANCE}={instance}"})
            return sorted(c.labels[Labels.AGENT] for c in found if c.labels[Labels.SCOPE_KEY].endswith(":work"))

        assert agents_with_work() == ["alpha", "beta"]
        listed_a = httpx.get(f"{url}/v1/sandboxes", headers=A).json()
        listed_b = httpx.get(f"{url}/v1/sandboxes", headers=B).json()
        assert {s["agent"] for s in listed_a} == {"alpha"} and {s["agent"] for s in listed_b} == {"beta"}
        assert 'sandbox_sandboxes{state="running"}' in httpx.get(f"{url}/metrics").text
        closed = httpx.delete(f"{url}/v1/sessions/work", headers=A, timeout=120)
        assert closed.status_code == 200 and closed.json()["closed"] == ["agent:alpha:work"]
        assert agents_with_work() == ["beta"]
        httpx.delete(f"{url}/v1/sessions/work", headers=B, timeout=120)


def test_a_client_that_goes_away_stops_its_call(make_config: Any, docker_client: Any, instance: str) -> None:
    """The client disconnects mid-call: the call is cancelled and its command killed in the sandbox."""
    import time

    with serve(config(make_config)) as url:
        call(url, A, "gone", "exec", {"command": "true"})  # the sandbox exists
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{url}/v1/sessions/gone/calls",
                headers=A,
                json={"tool": "exec", "args": {"command": "sleep 177", "timeout_s": 600}},
                timeout=2,
            )
        [box] = [
            c
            for c in docker_client.containers.list(filters={"label": f"{Labels.INSTANCE}={instance}"})
            if c.labels[Labels.SCOPE_KEY].endswith(":gone")
        ]
        deadline = time.monotonic() + 30
        while "sleep 177" in str(docker_client.api.top(box.id)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "sleep 177" not in str(docker_client.api.top(box.id))
        httpx.delete(f"{url}/v1/sessions/gone", headers=A, timeout=120)


def test_max_sandboxes_quota(make_config: Any) -> None:
    """A tenant at max_sandboxes gets 429 for a session that would need a new sandbox."""
    cfg = make_config(f"""
tenants:
  - {{id: acme, quotas: {{max_sandboxes: 1}}, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list: [{{id: alpha, tenant: acme, default: true}}]
""")
    with serve(cfg) as url:
        first = call(url, A, "q1", "exec", {"command": "true"})
        assert first["ok"], first
        again = call(url, A, "q1", "exec", {"command": "true"})  # its sandbox exists: fine
        assert again["ok"]
        second = httpx.post(
            f"{url}/v1/sessions/q2/calls", headers=A, json={"tool": "exec", "args": {"command": "true"}}, timeout=120
        )
        assert second.status_code == 429 and "max_sandboxes" in second.text
        httpx.delete(f"{url}/v1/sessions/q1", headers=A, timeout=120)
        assert call(url, A, "q2", "exec", {"command": "true"})["ok"]
        httpx.delete(f"{url}/v1/sessions/q2", headers=A, timeout=120)


def test_ready_when_the_engine_has_the_images(make_config: Any) -> None:
    """/readyz is 200 with every check `ok` once the engine answers and holds the default image."""
    with serve(config(make_config)) as url:
        r = httpx.get(f"{url}/readyz", timeout=30)
        assert r.status_code == 200 and r.json() == {"ready": True, "checks": {"journal": "ok", "engine": "ok"}}
