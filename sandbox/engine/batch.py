"""Batches of calls: in parallel (under the same limits) or in sequence, with declared dependencies.

Every call of a batch goes through the engine, the ones it does not run included: a call skipped
because a dependency failed, whose arguments could not be computed, or refused with its whole
batch (a bad spec) is journaled with its reason and has its own trace id.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.spec import ToolResult

# Arguments may be a function of the results so far (by call id), for sequential pipelines.
Arguments = dict[str, Any] | Callable[[dict[str, ToolResult]], dict[str, Any]]
# Runs one call; the engine's entry point.
Call = Callable[[str, Any], Awaitable[ToolResult]]
# Journals one call that is not run (name, arguments as known, why) and returns its result.
Refuse = Callable[[str, Any, SandboxError], Awaitable[ToolResult]]
NOT_COMPUTED = "<computed from earlier results; not computed>"


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


def _invalid(message: str) -> SandboxError:
    return SandboxError(ErrorCode.INVALID_ARGUMENTS, message)


def _ids(calls: list[BatchCall]) -> list[str]:
    ids = [c.id or f"call-{i}" for i, c in enumerate(calls)]
    if len(set(ids)) != len(ids):
        raise _invalid("call ids in a batch must be unique")
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
                raise _invalid(f"call {cid!r} depends on unknown call {dep!r}")
    remaining = {i: {index[d] for d in calls[i].depends_on} for i in range(len(calls))}
    waves: list[list[int]] = []
    while remaining:
        ready = sorted(i for i, deps in remaining.items() if not deps)
        if not ready:
            cycle = ", ".join(ids[i] for i in sorted(remaining))
            raise _invalid(f"the batch has a dependency cycle among: {cycle}")
        waves.append(ready)
        for i in ready:
            del remaining[i]
        for deps in remaining.values():
            deps.difference_update(ready)
    return waves


def plan(calls: list[Any], mode: str) -> list[list[int]]:
    """The waves a batch runs in: dependency waves (parallel) or one call at a time (sequential).

    Raises:
        SandboxError: INVALID_ARGUMENTS for a bad spec: an unknown mode, an item that is not a
            BatchCall, duplicate ids, unknown or cyclic dependencies, and in sequential mode a
            dependency on a call that comes later (it has not run when its result is needed).
    """
    if mode not in ("parallel", "sequential"):
        raise _invalid(f"unknown batch mode {mode!r}; use parallel or sequential")
    for i, item in enumerate(calls):
        if not isinstance(item, BatchCall) or not isinstance(item.depends_on, tuple | list):
            raise _invalid(f"batch item {i} is not a BatchCall(name, arguments, id, depends_on)")
    waves = check_dependencies(calls)
    if mode == "parallel":
        return waves
    ids = _ids(calls)
    for i, call in enumerate(calls):
        later = [d for d in call.depends_on if ids.index(d) >= i]
        if later:
            raise _invalid(
                f"call {ids[i]!r} depends on {', '.join(map(repr, later))}, which does not come before it; "
                "in sequential mode a call may depend only on earlier calls"
            )
    return [[i] for i in range(len(calls))]


def _journal_arguments(item: Any) -> Any:
    arguments = getattr(item, "arguments", None)
    return NOT_COMPUTED if callable(arguments) else arguments


async def run_batch(
    call: Call,
    calls: list[BatchCall],
    *,
    refuse: Refuse,
    mode: Literal["parallel", "sequential"] = "parallel",
    keyed: Callable[[str, Any, int], Awaitable[ToolResult]] | None = None,
) -> BatchResult:
    """Run `calls`. The spec is checked before anything runs; a call whose dependency failed is
    not run (BLOCKED); a call whose arguments function fails is INVALID_ARGUMENTS. Parallel calls
    obey the same limits as single calls (each goes through the engine).

    Raises:
        SandboxError: INVALID_ARGUMENTS for a bad spec (see :func:`plan`); every call of the
            batch is journaled as refused first.
    """
    try:
        waves = plan(calls, mode)
    except SandboxError as exc:
        for item in calls:
            name = item.name if isinstance(item, BatchCall) else str(item)[:128]
            await refuse(name, _journal_arguments(item), exc)
        raise
    ids = _ids(calls)
    done: dict[str, ToolResult] = {}

    async def one(i: int) -> None:
        spec = calls[i]
        failed_deps = [d for d in spec.depends_on if not done[d].ok]
        if failed_deps:
            blocked = SandboxError(ErrorCode.BLOCKED, f"not run: it depends on failed call(s) {', '.join(failed_deps)}")
            done[ids[i]] = await refuse(spec.name, _journal_arguments(spec), blocked)
            return
        if callable(spec.arguments):
            try:
                arguments = spec.arguments(dict(done))
            except Exception as exc:  # the caller's function: its failure is this call's, not the batch's
                error = _invalid(f"the arguments of call {ids[i]!r} could not be computed ({exc.__class__.__name__})")
                done[ids[i]] = await refuse(spec.name, NOT_COMPUTED, error)
                return
        else:
            arguments = spec.arguments
        # with a batch's idempotency key, each call runs under its own (engine/once.py)
        done[ids[i]] = await (call(spec.name, arguments) if keyed is None else keyed(spec.name, arguments, i))

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
