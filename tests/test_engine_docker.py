"""Limits around real exec in a real sandbox, measured inside the container."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from sandbox import Orchestrator

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

# Each command counts itself in and out under flock; the peak is what ran at once.
COUNT = (
    "flock /tmp/c.lock sh -c 'n=$(( $(cat /tmp/c 2>/dev/null || echo 0) + 1 )); echo $n > /tmp/c; echo $n >> /tmp/peak';"
    " sleep 0.1;"
    " flock /tmp/c.lock sh -c 'echo $(( $(cat /tmp/c) - 1 )) > /tmp/c'"
)


@pytest.mark.parametrize(("max_depth", "expect_full"), [(100, 0), (20, 38)])
async def test_sixty_execs_never_exceed_the_exec_limit(make_config: Any, max_depth: int, expect_full: int) -> None:
    """60 concurrent execs with global 10 / exec 2: never more than 2 inside; all run or get QUEUE_FULL."""
    config = make_config(
        f"limits: {{global_concurrency: 10, tenant_concurrency: 10, categories: {{exec: 2}}, queue: {{max_depth: {max_depth}, max_wait_s: 120}}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: agent}}}"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:limits")
        await sess.call("exec", {"command": "rm -f /tmp/c /tmp/peak"})
        results: list[Any] = []

        async def one() -> None:
            results.append(await sess.call("exec", {"command": COUNT}))

        async with anyio.create_task_group() as tg:
            for _ in range(60):
                tg.start_soon(one)
        codes = [r.error.code if r.error else "ok" for r in results]
        assert codes.count("QUEUE_FULL") == expect_full
        assert codes.count("ok") == 60 - expect_full
        peak = await sess.call("exec", {"command": "sort -n /tmp/peak | tail -1; wc -l < /tmp/peak"})
        top, count = peak.output["output"].split()
        assert int(top) == 2 and int(count) == 60 - expect_full


async def test_skills_run_inside_the_sandbox(make_config: Any, tmp_path: Any) -> None:
    """Skill handlers run in the session's sandbox (not in this process); their code is read-only there."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    config = make_config(
        f"skills: {{dirs: ['{root}/skills']}}\n"
        "tools: {also_allow: [line_count, json_query], profile: coding, sandbox: {tools: {also_allow: [line_count, json_query]}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: agent}}}"
    )
    async with Orchestrator(config) as orch:
        assert orch.skill_problems == []
        sess = orch.session("agent:main:skills")
        await sess.call("write", {"path": "src/a.py", "content": "a\nb\nc\n"})
        await sess.call("write", {"path": "src/b.py", "content": "x\n"})
        await sess.call("write", {"path": "data.json", "content": '{"users": [{"name": "ada"}, {"name": "bob"}]}'})
        counted = await sess.call("line_count", {"pattern": "src/*.py"})
        assert counted.ok, counted.error
        assert counted.output["files"] == 2 and counted.output["lines"] == 4
        assert counted.output["longest"][0]["path"] == "src/a.py"
        queried = await sess.call("json_query", {"path": "data.json", "query": "users.1.name"})
        assert queried.output == {"query": "users.1.name", "value": "bob"}
        missing = await sess.call("json_query", {"path": "data.json", "query": "users.7"})
        assert missing.error.code == "INTERNAL" and "no 'users.7'" in missing.error.message
        bad = await sess.call("line_count", {"top": 3})
        assert bad.error.code == "INVALID_ARGUMENTS"
        where = await sess.call(
            "exec", {"command": "ls /opt/skills/0; touch /opt/skills/0/line_count/x 2>&1; hostname"}
        )
        assert "line_count" in where.output["output"] and "Read-only file system" in where.output["output"]
        assert where.output["output"].split()[-1] == "sandbox"  # handlers ran where this runs


def test_engine_calls_over_the_local_socket_skip_the_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """requests reads the proxy variables on every call (0.2 ms of each engine call); no proxy
    applies to the engine's local socket, so the client does not look, and calls still work."""
    from sandbox.runtime.docker.client import connect

    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    client = connect(5)
    try:
        assert client.api.trust_env is False
        assert client.api.version()["ApiVersion"]
    finally:
        client.close()
