"""The memory tools against a real sandbox: a link planted from inside never leaks its target."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import Orchestrator

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


async def test_planted_link_in_memory_never_leaks(images: None, make_config: Any) -> None:
    """memory/leak.md -> /etc/hostname made by exec: get refuses it, search neither reads nor shows it."""
    config = make_config(
        "tools: {sandbox: {tools: {also_allow: [group:memory]}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_access: none}}}"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:memleak")
        planted = await sess.call(
            "exec", {"command": "mkdir -p memory && ln -s /etc/hostname memory/leak.md && cat memory/leak.md"}
        )
        assert planted.ok and planted.output["exit_code"] == 0
        hostname = planted.output["output"].strip()
        assert (await sess.call("write", {"path": "MEMORY.md", "content": f"notes {hostname}\n"})).ok
        got = await sess.call("memory_get", {"path": "memory/leak.md"})
        found = await sess.call("memory_search", {"query": hostname})
    assert got.error is not None and got.error.code == "PERMISSION_DENIED"
    assert hostname not in got.error.message
    assert found.ok and [r["path"].rsplit("/", 1)[-1] for r in found.output["results"]] == ["MEMORY.md"]
    assert [s["path"] for s in found.output["skipped"]] == ["memory/leak.md"]
    assert hostname not in str(found.output["skipped"])
