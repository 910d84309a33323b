"""memory_get and memory_search: read-only access to the agent's memory files, ranked by BM25.

The memory files are `MEMORY.md` and `memory/**/*.md` in the workspace. Every read goes through
the session's safe file layer (`ctx.files`), so links, traversal and deny patterns are refused
exactly as for `read`; only the listing of names under `memory/` is done here, without following
a link either.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.paths import WorkspacePath
from sandbox.fs.workspace import Located
from sandbox.tools.builtin import MemoryGetArgs, MemorySearchArgs
from sandbox.tools.context import ToolContext
from sandbox.tools.handlers.files import decode_text

MEMORY_FILE = "MEMORY.md"
MEMORY_DIR = "memory"
# bounds on what one search walks: a model can fill memory/ with files, not the host's memory
MAX_FILES = 2000
MAX_DEPTH = 16
CHUNK_LINES = 12
SNIPPET_CHARS = 400
# BM25's usual constants (Robertson / Lucene defaults)
K1 = 1.2
B = 0.75

_WORD = re.compile(r"\w+")


def is_memory_path(relative: str) -> bool:
    """Whether a workspace-relative path is a memory file (MEMORY.md or memory/**/*.md)."""
    return relative == MEMORY_FILE or (relative.startswith(f"{MEMORY_DIR}/") and relative.endswith(".md"))


def _locate_memory(ctx: ToolContext, raw: str) -> Located:
    loc = ctx.files.locate(raw)
    if loc.root is not ctx.files.roots[0] or not is_memory_path(loc.path.relative):
        raise SandboxError(
            ErrorCode.PERMISSION_DENIED,
            f"{loc.display}: memory tools only read MEMORY.md and memory/**/*.md in the workspace; "
            "use read for other files",
            path=loc.display,
        )
    return loc


async def list_memory_files(ctx: ToolContext) -> list[str]:
    """Workspace-relative names of memory/**/*.md, through the session's files (host folder or volume).

    Only names come from here; contents are read through the safe file layer.
    """
    # the folder itself is not checked against deny patterns: each name is, when it is read
    folder = Located(ctx.files.roots[0], WorkspacePath((MEMORY_DIR,)))
    return await ctx.files.list_names(folder, suffix=".md", max_depth=MAX_DEPTH, limit=MAX_FILES)


async def _read_text(ctx: ToolContext, loc: Located) -> str | None:
    """A memory file's text, or None when it does not exist (links and deny patterns raise)."""
    try:
        data, _ = await ctx.files.read_raw(loc)
    except SandboxError as exc:
        if exc.code == ErrorCode.FILE_NOT_FOUND:
            return None
        raise
    return decode_text(data, loc.display)


async def memory_get_tool(ctx: ToolContext, args: MemoryGetArgs) -> dict[str, Any]:
    """Lines `from`..`from+lines-1` (1-based) of one memory file; a missing file is an empty result."""
    loc = _locate_memory(ctx, args.path)
    text = await _read_text(ctx, loc)
    start = args.from_ or 1
    if text is None:
        return {
            "path": loc.display,
            "exists": False,
            "content": "",
            "from": start,
            "lines_returned": 0,
            "total_lines": 0,
            "note": f"{loc.display} does not exist yet; there is nothing in this memory file",
        }
    lines = text.splitlines(keepends=True)
    end = len(lines) if args.lines is None else min(len(lines), start - 1 + args.lines)
    chosen = lines[start - 1 : end]
    return {
        "path": loc.display,
        "exists": True,
        "content": "".join(chosen),
        "from": start,
        "lines_returned": len(chosen),
        "total_lines": len(lines),
    }


@dataclass(frozen=True)
class Chunk:
    """A block of consecutive lines of one file: the unit that is ranked and shown."""

    path: str
    start_line: int  # 1-based, inclusive
    end_line: int
    text: str
    terms: Counter[str]


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens (Unicode letters, digits, underscore)."""
    return _WORD.findall(text.lower())


def chunk_text(path: str, text: str) -> Iterator[Chunk]:
    """Paragraphs (runs of non-blank lines), each cut into pieces of at most CHUNK_LINES lines."""
    block: list[tuple[int, str]] = []
    for number, line in enumerate([*text.splitlines(), ""], 1):
        if line.strip() and len(block) < CHUNK_LINES:
            block.append((number, line))
            continue
        if block:
            body = "\n".join(item for _, item in block)
            yield Chunk(path, block[0][0], block[-1][0], body, Counter(tokenize(body)))
        block = [(number, line)] if line.strip() else []


def bm25_rank(chunks: list[Chunk], query: str) -> list[tuple[float, Chunk]]:
    """Exact Okapi BM25 (k1=1.2, b=0.75, idf = ln(1 + (N - df + 0.5) / (df + 0.5))), best first.

    Chunks that share no term with the query are left out; ties go by path, then line.
    """
    terms = sorted(set(tokenize(query)))
    if not chunks or not terms:
        return []
    total = len(chunks)
    avg_len = sum(sum(c.terms.values()) for c in chunks) / total or 1.0
    idf = {}
    for term in terms:
        df = sum(1 for c in chunks if term in c.terms)
        idf[term] = math.log(1 + (total - df + 0.5) / (df + 0.5))
    ranked = []
    for chunk in chunks:
        length = sum(chunk.terms.values())
        score = 0.0
        for term in terms:
            tf = chunk.terms.get(term, 0)
            if tf:
                score += idf[term] * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avg_len))
        if score > 0:
            ranked.append((score, chunk))
    ranked.sort(key=lambda item: (-item[0], item[1].path, item[1].start_line))
    return ranked


def _snippet(text: str) -> str:
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


async def memory_search_tool(ctx: ToolContext, args: MemorySearchArgs) -> dict[str, Any]:
    """Rank the memory files' paragraphs against `query` (BM25); snippets with line numbers."""
    names = [MEMORY_FILE, *await list_memory_files(ctx)]
    chunks: list[Chunk] = []
    searched: list[str] = []
    skipped: list[dict[str, str]] = []
    for name in names:
        try:
            loc = _locate_memory(ctx, name)
            text = await _read_text(ctx, loc)
        except SandboxError as exc:  # a link, a deny pattern, binary content: skipped, and said so
            skipped.append({"path": name, "reason": exc.message})
            continue
        if text is None:
            continue
        searched.append(loc.display)
        chunks.extend(chunk_text(loc.display, text))
    results = [
        {
            "path": chunk.path,
            "start_line": chunk.start_line,
            "end_line": chunk.end_line,
            "score": round(score, 4),
            "snippet": _snippet(chunk.text),
        }
        for score, chunk in bm25_rank(chunks, args.query)[: args.limit]
    ]
    out: dict[str, Any] = {"query": args.query, "results": results, "files_searched": len(searched)}
    if skipped:
        out["skipped"] = skipped
    if not searched:
        out["note"] = "no memory files yet (MEMORY.md, memory/**/*.md in the workspace); nothing to search"
    return out
