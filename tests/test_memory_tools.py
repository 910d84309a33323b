"""memory_get and memory_search over MEMORY.md and memory/**/*.md, in mode off and on the host backend."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.tools.handlers.memory import Chunk, bm25_rank, chunk_text

pytestmark = pytest.mark.anyio

MEMORY = "# Memory\n\nThe user prefers tabs over spaces.\n\nDeploys go out on Tuesdays.\n"
DAY = "# 2026-01-05\n\nMet Alice about the deploy pipeline.\nAlice owns the deploy key rotation.\n"


@pytest.fixture(params=["off", "host"], ids=["mode-off", "host"])
def config(request: Any, make_config: Any, tmp_path: Path) -> Any:
    """A config whose sessions may call the memory tools, on the backend under test."""
    if request.param == "off":
        ws = tmp_path / "ws"
        ws.mkdir()
        return make_config(
            f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: main, workspace: '{ws}'}}]}}"
        )
    return make_config(
        "runtime: {backend: host}\n"
        "tools: {sandbox: {tools: {also_allow: [group:memory]}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_access: none}}}"
    )


async def _seed(sess: Any) -> None:
    assert (await sess.call("write", {"path": "MEMORY.md", "content": MEMORY})).ok
    assert (await sess.call("write", {"path": "memory/2026-01-05.md", "content": DAY})).ok
    assert (await sess.call("write", {"path": "memory/deep/notes.md", "content": "tabs are nice\n"})).ok
    assert (await sess.call("write", {"path": "notes.md", "content": "deploy secret outside memory\n"})).ok


async def test_memory_tools_are_offered_and_run(config: Any) -> None:
    """Both memory tools are in the session's tool list once the policy allows them."""
    async with Orchestrator(config) as orch:
        names = {t.name for t in orch.session("agent:main:m0").tools()}
    assert {"memory_search", "memory_get"} <= names


async def test_search_ranks_snippets_with_line_numbers(config: Any) -> None:
    """memory_search returns the best paragraph first, with its path and 1-based line range."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:m1")
        await _seed(sess)
        found = await sess.call("memory_search", {"query": "Alice deploy", "limit": 3})
    assert found.ok, found.error
    top = found.output["results"][0]
    assert top["path"].endswith("memory/2026-01-05.md")
    assert (top["start_line"], top["end_line"]) == (3, 4) and "Alice owns" in top["snippet"]
    assert found.output["files_searched"] == 3
    assert all("outside memory" not in r["snippet"] for r in found.output["results"])
    scores = [r["score"] for r in found.output["results"]]
    assert scores == sorted(scores, reverse=True) and len(scores) <= 3


async def test_get_reads_a_line_range(config: Any) -> None:
    """memory_get returns `lines` lines from the 1-based line `from`."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:m2")
        await _seed(sess)
        got = await sess.call("memory_get", {"path": "MEMORY.md", "from": 3, "lines": 1})
        whole = await sess.call("memory_get", {"path": "memory/deep/notes.md"})
    assert got.ok and got.output["content"] == "The user prefers tabs over spaces.\n"
    assert got.output["total_lines"] == 5 and got.output["exists"]
    assert whole.ok and whole.output["content"] == "tabs are nice\n"


async def test_paths_outside_memory_are_refused(config: Any) -> None:
    """memory_get refuses workspace files outside MEMORY.md / memory/, traversal included."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:m3")
        await _seed(sess)
        results = [
            await sess.call("memory_get", {"path": path})
            for path in ("notes.md", "memory/../notes.md", "memory/x.txt", "../MEMORY.md", "/etc/hostname")
        ]
    for result in results:
        assert result.error is not None and result.error.code == "PERMISSION_DENIED", result
    assert "MEMORY.md and memory/**/*.md" in results[0].error.message


async def test_missing_memory_is_an_empty_result(config: Any) -> None:
    """With no memory files, search finds nothing and get says the file does not exist yet."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:m4")
        found = await sess.call("memory_search", {"query": "anything"})
        got = await sess.call("memory_get", {"path": "memory/none.md"})
    assert found.ok and found.output["results"] == [] and "no memory files" in found.output["note"]
    assert got.ok and not got.output["exists"] and got.output["content"] == ""


async def test_a_planted_link_is_refused(config: Any) -> None:
    """A symlink in memory/ (made by exec) is never read: get refuses it, search skips it."""
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:m5")
        await _seed(sess)
        secret = Path(orch.config.state_dir) / "secret-outside.md"
        secret.write_text("zebracorn secret\n")
        assert (await sess.call("exec", {"command": f"ln -s {secret} memory/leak.md && ln -s .. memory/up"})).ok
        got = await sess.call("memory_get", {"path": "memory/leak.md"})
        found = await sess.call("memory_search", {"query": "zebracorn secret"})
    assert got.error is not None and got.error.code == "PERMISSION_DENIED"
    assert found.ok and found.output["results"] == []
    assert [s["path"] for s in found.output["skipped"]] == ["memory/leak.md"]
    assert "zebracorn" not in str(found.output["results"]) + str(found.output["skipped"])


def test_bm25_is_exact_on_a_small_corpus() -> None:
    """The score of one chunk matches Okapi BM25 computed by hand."""
    chunks: list[Chunk] = [*chunk_text("a", "cat cat dog"), *chunk_text("b", "dog bird")]
    (score, top), second = bm25_rank(chunks, "cat")[0], bm25_rank(chunks, "dog")
    # N=2, df(cat)=1: idf=ln(1+1.5/1.5)=ln 2; tf=2, |d|=3, avgdl=2.5

    expected = math.log(2) * 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 3 / 2.5))
    assert top.path == "a" and abs(score - expected) < 1e-12
    assert [c.path for _, c in second] == ["b", "a"]  # the shorter chunk wins on equal tf


def test_chunks_are_paragraphs_of_bounded_length() -> None:
    """Paragraphs split at blank lines and every 12 lines, with 1-based line numbers."""
    text = "a\nb\n\n" + "\n".join(f"l{i}" for i in range(15)) + "\n"
    spans = [(c.start_line, c.end_line) for c in chunk_text("p", text)]
    assert spans == [(1, 2), (4, 15), (16, 18)]
