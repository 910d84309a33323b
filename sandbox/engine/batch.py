"""Batches of calls: in parallel (under the same limits) or in sequence, with declared dependencies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from sandbox.engine.context import new_id
from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.spec import ToolResult

# Arguments may be a function of the results so far (by call id), for sequential pipelines.
Arguments = dict[str, Any] | Callable[[dict[str, ToolResult]], dict[str, Any]]


@dataclass(frozen=True)
class BatchCall:
    """One call of a batch; `depends_on` names ids of calls that must finish first."""

    name: str
    arguments: Arguments = field(default_factory=dict)
    id: str = ""
    depends_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class BatchResult:
    """Per-call results in the order given, and the batch's overall status."""

    status: Literal["SUCCESS", "PARTIAL_SUCCESS", "FAILURE"]
    results: list[ToolResult]
    failed: list[str]  # ids of the calls that did not succeed


def _ids(calls: list[BatchCall]) -> list[str]:
    ids = [c.id or f"call-{i}" for i, c in enumerate(calls)]
    if len(set(ids)) != len(ids):
        raise SandboxError(ErrorCode.INVALID_ARGUMENTS, "call ids in a batch must be unique")
    return ids


def check_dependencies(calls: list[BatchCall]) -> list[list[int]]:
    """Waves of call indexes in dependency order.

    Raises:
        SandboxError: INVALID_ARGUMENTS for an unknown dependency or a cycle (naming it).
    """
    ids = _ids(calls)
    index = {cid: i for i, cid in enumerate(ids)}
    for call, cid in zip(calls, ids, strict=True):
        for dep in call.depends_on:
            if dep not in index:
                raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"call {cid!r} depends on unknown call {dep!r}")
    remaining = {i: {index[d] for d in calls[i].depends_on} for i in range(len(calls))}
    waves: list[list[int]] = []
    while remaining:
        ready = sorted(i for i, deps in remaining.items() if not deps)
        if not ready:
            cycle = ", ".join(ids[i] for i in sorted(remaining))
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"the batch has a dependency cycle among: {cycle}")
        waves.append(ready)
        for i in ready:
            del remaining[i]
        for deps in remaining.values():
            deps.difference_update(ready)
    return waves


async def run_batch(
    call: Callable[[str, Any], Awaitable[ToolResult]],
    calls: list[BatchCall],
    *,
    mode: Literal["parallel", "sequential"] = "parallel",
) -> BatchResult:
    """Run `calls`. Dependencies and cycles are checked before anything runs; a call whose
    dependency failed is not run (it fails with BLOCKED). Parallel calls obey the same limits as
    single calls (each goes through the engine)."""
    ids = _ids(calls)
    waves = check_dependencies(calls) if mode == "parallel" else [[i] for i in range(len(calls))]
    done: dict[str, ToolResult] = {}

    async def one(i: int) -> None:
        spec = calls[i]
        failed_deps = [d for d in spec.depends_on if not done[d].ok]
        if failed_deps:
            done[ids[i]] = _blocked(spec.name, failed_deps)
            return
        arguments = spec.arguments(dict(done)) if callable(spec.arguments) else spec.arguments
        done[ids[i]] = await call(spec.name, arguments)

    if mode == "sequential":
        check_dependencies(calls)  # still refuse cycles and unknown ids
        for i in range(len(calls)):
            await one(i)
    else:
        for wave in waves:
            async with anyio.create_task_group() as tg:
                for i in wave:
                    tg.start_soon(one, i)
    results = [done[cid] for cid in ids]
    failed = [cid for cid, r in zip(ids, results, strict=True) if not r.ok]
    status: Literal["SUCCESS", "PARTIAL_SUCCESS", "FAILURE"] = (
        "SUCCESS" if not failed else "FAILURE" if len(failed) == len(results) else "PARTIAL_SUCCESS"
    )
    return BatchResult(status, results, failed)


def _blocked(tool: str, deps: list[str]) -> ToolResult:
    from sandbox.tools.spec import ErrorInfo

    return ToolResult(
        ok=False,
        tool=tool,
        call_id=new_id("c").replace("-", "_"),
        trace_id="",
        error=ErrorInfo(
            code=ErrorCode.BLOCKED.value, message=f"not run: it depends on failed call(s) {', '.join(deps)}"
        ),
    )
