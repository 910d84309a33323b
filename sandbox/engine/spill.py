"""Saving the full text of a cut output where the tenant can read it, within bounded budgets.

A full output goes to the session's workspace, `.sandbox/outputs/<call id>.txt`, within the
workspace's and its tenant's quotas (the sandbox can read it back), and `full_output_path` names it
relative to the workspace: never a host path. A workspace the orchestrator cannot write for
the tenant (read-only, or a Docker volume) keeps no full output: the result says so. An `exec`
output too long to hold in memory is captured host-side while its call runs
(state_dir/outputs/<tenant>/, bounded per call by the quota's room and per tenant by a reserved
budget, see runtime/output.py) and then copied in by the same rule; the capture never outlives
its call. The outputs directory keeps at most :data:`MAX_FILES` outputs and :data:`MAX_BYTES`
bytes: the oldest are removed first to make room, and one output larger than the whole budget
is not saved (the caller says so). Every access goes through :class:`SafeRoot`, so a link
planted at `.sandbox` is refused, not followed.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.paths import WorkspacePath
from sandbox.fs.quota import WorkspaceQuota, parse_size
from sandbox.fs.safe import FileStat, SafeRoot
from sandbox.runtime.output import OutputCapture, SpillBudget, capture_folder

if TYPE_CHECKING:
    from sandbox.tools.context import ToolContext

MAX_FILES = 20
MAX_BYTES = 64 * 1024 * 1024
SUFFIX = ".txt"
OUTPUTS = (".sandbox", "outputs")  # in the workspace
# a tenant without max_workspace_bytes: what its long outputs in flight may hold at once
CAPTURE_MAX_BYTES = 4 * 1024**3
LEFTOVER_GRACE_S = 120.0  # a capture older than the longest command plus this is a crash's leftover
SWEEP_EVERY_S = 60.0  # a tenant's capture folder is swept for leftovers at most this often


@dataclass(frozen=True)
class Budget:
    """How much one outputs directory may hold."""

    max_files: int = MAX_FILES
    max_bytes: int = MAX_BYTES


def to_remove(existing: list[tuple[str, FileStat]], incoming: int, budget: Budget) -> list[str]:
    """Names of the oldest outputs to remove so that one more of `incoming` bytes fits the budget."""
    ours = sorted(
        ((st.mtime_ns, name, st.size) for name, st in existing if name.endswith(SUFFIX)),
    )
    count = len(ours)
    total = sum(size for _, _, size in ours)
    removed: list[str] = []
    for _, name, size in ours:
        if count + 1 <= budget.max_files and total + incoming <= budget.max_bytes:
            break
        removed.append(name)
        count -= 1
        total -= size
    return removed


def save(
    root: SafeRoot, directory: WorkspacePath, name: str, data: bytes | Path, budget: Budget, mode: int = 0o644
) -> None:
    """Write `directory/name` under `root`, pruning the oldest outputs there first.

    Raises:
        SandboxError: QUOTA_EXCEEDED when `data` alone is over the budget; PERMISSION_DENIED
            when a component is a link; others from the file system.
    """
    size = data.stat().st_size if isinstance(data, Path) else len(data)
    if size > budget.max_bytes:
        raise SandboxError(
            ErrorCode.QUOTA_EXCEEDED,
            f"the full output is {size:,} bytes, over the {budget.max_bytes:,}-byte budget for saved outputs",
            size=size,
            max_bytes=budget.max_bytes,
        )
    try:
        existing = root.list_files(directory)
    except SandboxError as exc:
        if exc.code != ErrorCode.FILE_NOT_FOUND:
            raise
        existing = []
    for old in to_remove(existing, size, budget):
        try:
            root.unlink(WorkspacePath((*directory.parts, old)))
        except SandboxError as exc:  # removed meanwhile by another call: fine
            if exc.code != ErrorCode.FILE_NOT_FOUND:
                raise
    root.write_atomic(WorkspacePath((*directory.parts, name)), data, mode=mode)


def relative_path(name: str) -> str:
    """What `full_output_path` says: the file relative to the workspace (never a host path)."""
    return "/".join((*OUTPUTS, name))


def not_kept(ctx: ToolContext) -> str | None:
    """Why no full output can be kept for this call's session (None: it can, in the workspace).
    Nothing of a tenant's is kept anywhere else on the host."""
    root = ctx.files.roots[0]
    if root.read_only or not ctx.files.host_side:
        where = "read-only" if root.read_only else "a Docker volume"
        return (
            f"the workspace is {where}, so the full output is not kept; redirect long output to a file "
            "(e.g. under /tmp) and read it in parts"
        )
    return None


def _writable_root(ctx: ToolContext) -> SafeRoot:
    """The workspace as the tenant's files are written there (see :func:`not_kept`)."""
    why = not_kept(ctx)
    if why is not None:
        raise SandboxError(ErrorCode.PERMISSION_DENIED, why)
    root = ctx.files.roots[0]
    return SafeRoot(root.host, ctx.files.safe_owner, ctx.files.quota, group_shared=ctx.files.group_shared)


async def publish(ctx: ToolContext, data: str | Path) -> str:
    """Save a full output in the workspace; its workspace-relative path.

    `data` may be a host file that already holds it (exec's capture): it is copied in chunks and
    the caller removes it (see :func:`new_capture`).

    Raises:
        SandboxError: PERMISSION_DENIED for a read-only or volume workspace; QUOTA_EXCEEDED past
            the budget or a quota; others from the file system. The engine makes it a warning.
    """
    safe = _writable_root(ctx)
    name = f"{ctx.call_id}{SUFFIX}"
    body = data if isinstance(data, Path) else str(data).encode("utf-8", "replace")
    await anyio.to_thread.run_sync(save, safe, WorkspacePath(OUTPUTS), name, body, Budget())
    return relative_path(name)


# -- exec's capture of long outputs -----------------------------------------------------------

_budgets: dict[tuple[str, int], SpillBudget] = {}
_budgets_lock = threading.Lock()


def tenant_capture_budget(ctx: ToolContext) -> SpillBudget:
    """The budget a tenant's captures in flight share (this process): its max_workspace_bytes."""
    key = _budget_key(ctx)
    folder = Path(key[0])
    limit = key[1]
    with _budgets_lock:
        budget = _budgets.get(key)
        if budget is None:
            # what another process (or a crash) holds there counts from the start
            budget = _budgets[key] = SpillBudget(limit, sum(size for _, size in _captures(folder)))
        return budget


def _budget_key(ctx: ToolContext) -> tuple[str, int]:
    limit = CAPTURE_MAX_BYTES
    for tenant in ctx.config.tenants:
        if tenant.id == ctx.agent.tenant and (bytes_ := parse_size(tenant.quotas.max_workspace_bytes)):
            limit = bytes_
    return os.fspath(capture_folder(ctx.config.state_dir, ctx.agent.tenant)), limit


def _budget_known(ctx: ToolContext) -> bool:
    with _budgets_lock:
        return _budget_key(ctx) in _budgets


_swept: dict[str, float] = {}  # capture folder -> when it was last swept (monotonic)
_swept_lock = threading.Lock()


def _sweep_due(folder: Path, *, mark: bool = True) -> bool:
    """Whether `folder` was not swept for leftovers within SWEEP_EVERY_S (`mark`: and it is now)."""
    now = time.monotonic()
    with _swept_lock:
        last = _swept.get(os.fspath(folder))
        due = last is None or now - last >= SWEEP_EVERY_S
        if due and mark:
            _swept[os.fspath(folder)] = now
        return due


def _captures(folder: Path) -> list[tuple[os.DirEntry[str], int]]:
    try:
        entries = [e for e in os.scandir(folder) if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    out = []
    for entry in entries:
        with contextlib.suppress(FileNotFoundError):
            out.append((entry, entry.stat(follow_symlinks=False).st_size))
    return out


def remove_leftovers(folder: Path, max_age_s: float) -> int:
    """Remove captures older than any call can run (a crashed process's); how many went."""
    cutoff = time.time() - max_age_s
    removed = 0
    for entry, _ in _captures(folder):
        with contextlib.suppress(FileNotFoundError):
            if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
    return removed


def quota_room(quota: WorkspaceQuota | None) -> int:
    """The bytes a full output may take in the workspace: the saved-outputs budget, less what
    the workspace's and its tenant's quotas have left (a cached measurement)."""
    room = MAX_BYTES
    for level in quota.levels if quota is not None else []:
        room = min(room, max(0, level.limit - level.used()))
    return room


async def new_capture(ctx: ToolContext) -> OutputCapture:
    """The output capture of one exec call: spilling to its tenant's capture folder, within the
    room a saved copy could take and the tenant's budget; no spill at all where no copy can be
    kept (a read-only or volume workspace). The caller calls `discard()` when the call ends."""
    max_bytes = ctx.config.tools.exec.max_output_bytes
    if not_kept(ctx) is not None:
        return OutputCapture(None, max_bytes=max_bytes)
    folder = capture_folder(ctx.config.state_dir, ctx.agent.tenant)

    def prepare() -> tuple[int, SpillBudget]:  # walks folders: off the event loop
        if _sweep_due(folder):
            remove_leftovers(folder, ctx.config.tools.exec.max_timeout_s + LEFTOVER_GRACE_S)
        return quota_room(ctx.files.quota), tenant_capture_budget(ctx)

    quota = ctx.files.quota
    if quota is not None and not quota.cached():
        quota.measure_small()  # a session's first call: its new (small) workspace needs no thread
    walks = _sweep_due(folder, mark=False) or not _budget_known(ctx) or (quota is not None and not quota.cached())
    # what needs no walk (a recent sweep, a known budget, fresh measurements) is done here: a
    # thread hop costs an exec call more than the work
    room, budget = await anyio.to_thread.run_sync(prepare) if walks else prepare()
    return OutputCapture(
        folder / f"{ctx.call_id}{SUFFIX}", max_bytes=max_bytes, spill_max_bytes=room, spill_budget=budget
    )
