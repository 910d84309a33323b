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


async def test_search_reads_memory_folder_on_a_volume_workspace(images: None, make_config: Any) -> None:
    """workspace_store: volume (no host folder): memory/**/*.md is searched through the agent, and a
    link planted there is listed, refused and never read (it was never searched before)."""
    config = make_config(
        "tools: {sandbox: {tools: {also_allow: [group:memory]}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_store: volume}}}"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:memvol")
        made = await sess.call(
            "exec",
            {
                "command": "mkdir -p memory/deep/er && echo 'the heron nests by the weir' > memory/deep/er/birds.md"
                " && echo 'heron' > memory/skip.txt && ln -s /etc/hostname memory/leak.md && cat memory/leak.md"
            },
        )
        assert made.ok and made.output["exit_code"] == 0, made
        hostname = made.output["output"].strip()
        assert (await sess.call("write", {"path": "MEMORY.md", "content": "nothing about birds\n"})).ok
        found = await sess.call("memory_search", {"query": "heron weir"})
        leaked = await sess.call("memory_search", {"query": hostname})
    assert found.ok, found
    assert [r["path"] for r in found.output["results"]] == ["/workspace/memory/deep/er/birds.md"]
    assert "heron" in found.output["results"][0]["snippet"]
    assert found.output["files_searched"] == 2  # MEMORY.md and birds.md; skip.txt is not a memory file
    assert [s["path"] for s in found.output["skipped"]] == ["memory/leak.md"]
    assert leaked.ok and leaked.output["results"] == [] and hostname not in str(leaked.output["skipped"])
