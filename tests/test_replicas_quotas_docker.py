"""A tenant's session and sandbox quotas across two real `sandbox serve` replicas on one
PostgreSQL and one engine: `max_sessions` counts the keys open through either replica, and a
burst of new sessions split across both never makes more than `max_sandboxes` sandboxes (each
used to be counted per process, so two replicas admitted twice the quota)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import docker
import httpx
import pytest

from tests.conftest import RUN_ID
from tests.service_helpers import TOKEN_A, TOKEN_B, remove_instance, sha
from tests.test_replicas_docker import _start, _stop, _workspace

pytestmark = [pytest.mark.docker, pytest.mark.postgres, pytest.mark.usefixtures("images")]

A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}
INSTANCE = f"repq{RUN_ID}"


@pytest.fixture(autouse=True)
def _sandboxes_go() -> Iterator[None]:
    yield
    remove_instance(INSTANCE)


def _config(tmp_path: Path, name: str, pg_url: str, ws: Path) -> Path:
    gamma = Path(f"{ws}-gamma")
    if not gamma.exists():
        gamma.mkdir()
        os.chown(gamma, 1000, 1000)
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "sandbox.yaml"
    path.write_text(f"""
state_dir: {folder / "state"}
instance: {INSTANCE}
state: {{url: '{pg_url}', lease_s: 6}}
tenants:
  - {{id: acme, quotas: {{max_sessions: 2}}, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, quotas: {{max_sandboxes: 2}}, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: rw}}}}
  list:
    - {{id: alpha, tenant: acme, workspace: {ws}}}
    - {{id: gamma, tenant: globex, workspace: {ws}-gamma}}
""")
    return path


def _call(url: str, headers: dict[str, str], key: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/sessions/{key}/calls",
        headers=headers,
        json={"tool": "exec", "args": {"command": "true"}},
        timeout=120,
    )


def test_max_sessions_counts_the_sessions_open_through_either_replica(tmp_path: Path, pg_url: str) -> None:
    """s1 through A and s2 through B fill `max_sessions: 2`: s3 through A is refused, s1 through
    B costs nothing, and s1 closed through B frees a place for s3 through A."""
    ws = _workspace(tmp_path, pg_url)
    url_a, proc_a = _start(_config(tmp_path, "a", pg_url, ws))
    url_b, proc_b = _start(_config(tmp_path, "b", pg_url, ws))
    try:
        assert _call(url_a, A, "agent:alpha:s1").status_code == 200
        assert _call(url_b, A, "agent:alpha:s2").status_code == 200
        refused = _call(url_a, A, "agent:alpha:s3")
        assert refused.status_code == 429, refused.text
        assert "max_sessions is 2; counted across replicas" in refused.text and refused.headers["Retry-After"] == "60"
        assert _call(url_b, A, "agent:alpha:s1").status_code == 200  # open already: not counted again
        closed = httpx.delete(f"{url_b}/v1/sessions/agent:alpha:s1", headers=A, timeout=60)
        assert closed.status_code == 200 and "agent:alpha:s1" in closed.json()["closed"], closed.text
        assert _call(url_a, A, "agent:alpha:s3").status_code == 200
    finally:
        _stop(proc_a)
        _stop(proc_b)


def test_a_burst_of_new_sessions_across_replicas_never_makes_more_than_max_sandboxes(
    tmp_path: Path, pg_url: str
) -> None:
    """Six new sessions at once, three through each replica, under `max_sandboxes: 2`: two are
    admitted, four refused naming the quota, and the engine holds two of the tenant's sandboxes."""
    ws = _workspace(tmp_path, pg_url)
    url_a, proc_a = _start(_config(tmp_path, "a", pg_url, ws))
    url_b, proc_b = _start(_config(tmp_path, "b", pg_url, ws))
    answers: list[httpx.Response] = []
    try:

        async def burst() -> None:
            async with httpx.AsyncClient(headers=B, timeout=120) as client:

                async def one(url: str, n: int) -> None:
                    answers.append(
                        await client.post(
                            f"{url}/v1/sessions/agent:gamma:n{n}/calls",
                            json={"tool": "exec", "args": {"command": "true"}},
                        )
                    )

                async with anyio.create_task_group() as group:
                    for n in range(6):
                        group.start_soon(one, url_a if n % 2 else url_b, n)

        anyio.run(burst)
        codes = sorted(a.status_code for a in answers)
        assert codes == [200, 200, 429, 429, 429, 429], [(a.status_code, a.text[:200]) for a in answers]
        assert all("max_sandboxes is 2" in a.text for a in answers if a.status_code == 429)
        engine = docker.from_env()
        try:
            made = engine.containers.list(
                all=True, filters={"label": [f"io.agent-sandbox.instance={INSTANCE}", "io.agent-sandbox.tenant=globex"]}
            )
        finally:
            engine.close()
        assert len(made) == 2, [c.name for c in made]
    finally:
        _stop(proc_a)
        _stop(proc_b)
