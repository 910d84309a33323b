"""max_sandboxes is reserved against the real engine: four simultaneous requests on four new
sessions (a sandbox each) under `max_sandboxes: 1` make one sandbox, not 3-4 (each request's
check saw none yet, while the first one was still being made)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from tests.service_helpers import TOKEN_A, serve, sha

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

A = {"Authorization": f"Bearer {TOKEN_A}"}


async def burst(url: str, keys: list[str]) -> list[httpx.Response]:
    """One exec call on each key, at once: every head first, then every body."""
    answers: dict[int, httpx.Response] = {}
    heads_out = 0
    all_out = anyio.Event()

    async def body_after_every_head() -> Any:
        nonlocal heads_out
        heads_out += 1
        if heads_out == len(keys):
            all_out.set()
        await all_out.wait()
        await anyio.sleep(0.05)
        yield json.dumps({"tool": "exec", "args": {"command": "echo made"}}).encode()

    async with httpx.AsyncClient(base_url=url, headers=A, timeout=180) as client:

        async def one(i: int, key: str) -> None:
            answers[i] = await client.post(
                f"/v1/sessions/{key}/calls",
                content=body_after_every_head(),
                headers={"content-type": "application/json"},
            )

        async with anyio.create_task_group() as tg:
            for i, key in enumerate(keys):
                tg.start_soon(one, i, key)
    return [answers[i] for i in range(len(keys))]


def test_four_new_sandboxes_at_once_make_one_under_max_sandboxes_1(make_config: Any) -> None:
    """Four simultaneous first calls of four sessions: one 200, three 429 naming max_sandboxes,
    and one live sandbox of the tenant on the engine."""
    config = make_config(f"""
tenants:
  - {{id: acme, quotas: {{max_sandboxes: 1}}, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list: [{{id: alpha, tenant: acme, default: true}}]
""")
    with serve(config) as url:
        answers = anyio.run(burst, url, [f"agent:alpha:burst{i}" for i in range(4)])
        listed = httpx.get(f"{url}/v1/sandboxes", headers=A, timeout=60).json()
        statuses = sorted(a.status_code for a in answers)
        print(f"max_sandboxes 1, 4 at once (real engine): statuses {statuses}, {len(listed)} sandboxes live")
        for i, a in enumerate(answers):
            if a.status_code == 200:
                httpx.delete(f"{url}/v1/sessions/agent:alpha:burst{i}", headers=A, timeout=120)
    assert statuses == [200, 429, 429, 429], [a.text for a in answers]
    assert all("max_sandboxes" in a.text for a in answers if a.status_code == 429)
    assert len(listed) == 1, listed
