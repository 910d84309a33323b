"""Saving the full text of a cut output, within a bounded budget per directory.

A writable workspace keeps them in `.sandbox/outputs/` (the sandbox can read them back); a
read-only one in the session's folder of the state dir, `spilled/` (owner-only files). An
`exec` output too long to hold in memory is captured host-side first (state_dir/outputs/<tenant>/) and
then copied in by the same rule. Either directory keeps at
most :data:`MAX_FILES` outputs and :data:`MAX_BYTES` bytes: the oldest are removed first to make
room, and one output larger than the whole budget is not saved (the caller says so). Every
access goes through :class:`SafeRoot`, so a link planted at `.sandbox` is refused, not followed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.paths import WorkspacePath
from sandbox.fs.safe import FileStat, SafeRoot

MAX_FILES = 20
MAX_BYTES = 64 * 1024 * 1024
SUFFIX = ".txt"
STATE_SUBDIR = "spilled"  # in a session's state folder (exec's own capture is state_dir/outputs/)


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
