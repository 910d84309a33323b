"""apply_patch: verify every hunk of every file in memory, then write; all or nothing.

All or nothing covers moves and deletes too: before anything is written, every file the patch
touches (sources, "Move to" destinations, deletions, additions) is read into a snapshot, and a
failure half-way through the writes puts each one back as it was, or removes it if it was absent.
"""

from __future__ import annotations

import stat
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio.to_thread

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.patch import FileOp, PatchError, apply_hunks, parse
from sandbox.fs.protocol import Files
from sandbox.fs.workspace import Located
from sandbox.tools.builtin import ApplyPatchArgs
from sandbox.tools.context import ToolContext
from sandbox.tools.handlers.files import check_write_size, decode_text


@dataclass(frozen=True)
class Before:
    """A touched file as it was before the patch: its bytes and mode, or absent."""

    data: bytes | None
    mode: int = 0o644


@dataclass(frozen=True)
class Step:
    """One write of the plan: new content (with the mode of a new file), or None to delete."""

    loc: Located
    data: bytes | None
    # None: the workspace's own default for a new file (0664 where sessions share it by group,
    # like `write` makes them), not a fixed 0644
    mode: int | None = None


Target = tuple[FileOp, Located, Located | None]  # an operation, its file, its "Move to" destination


def _locate_all(files: Files, ops: list[FileOp]) -> tuple[list[Target], dict[str, Located]]:
    located: list[Target] = []
    touched: dict[str, Located] = {}
    for op in ops:
        loc = files.locate(op.path)
        files.check_writable(loc)
        dest = files.locate(op.move_to) if op.move_to else None
        if dest is not None:
            files.check_writable(dest)
            if dest.key == loc.key:
                dest = None
        for item in (loc, dest):
            if item is None:
                continue
            # one operation per file: a second one would see the disk, not the first one's result
            if item.key in touched:
                raise SandboxError(
                    ErrorCode.INVALID_ARGUMENTS,
                    f"{item.display}: named by more than one operation of the patch; "
                    "combine them into one, nothing changed",
                    path=item.display,
                )
            touched[item.key] = item
        located.append((op, loc, dest))
    return located, touched


async def _snapshot(files: Files, loc: Located) -> Before:
    st = await files.stat(loc)
    if st is None:
        return Before(None)
    if not st.is_file:
        raise SandboxError(
            ErrorCode.CONFLICT,
            f"{loc.display}: exists and is not a regular file; nothing changed",
            path=loc.display,
        )
    data, read = await files.read_raw(loc)
    return Before(data, stat.S_IMODE(read.mode))


def _plan(ctx: ToolContext, located: list[Target], before: dict[str, Before]) -> tuple[list[Step], list[str]]:
    plan: list[Step] = []
    summary: list[str] = []
    for op, loc, dest in located:
        old = before[loc.key]
        if op.kind == "add":
            if old.data is not None:
                raise SandboxError(
                    ErrorCode.CONFLICT, f"{loc.display}: Add File, but it already exists; use Update File"
                )
            plan.append(Step(loc, op.content.encode("utf-8")))
            summary.append(f"A {loc.display}")
            continue
        if old.data is None:
            raise SandboxError(ErrorCode.FILE_NOT_FOUND, f"{loc.display}: no such file to {op.kind}")
        if op.kind == "delete":
            plan.append(Step(loc, None))
            summary.append(f"D {loc.display}")
            continue
        try:
            new_text = apply_hunks(loc.display, decode_text(old.data, loc.display), op.hunks)
        except PatchError as exc:
            raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"patch does not apply, nothing changed: {exc}") from exc
        if dest is not None:
            replaced = " (replacing it)" if before[dest.key].data is not None else ""
            plan += [Step(dest, new_text.encode("utf-8"), old.mode), Step(loc, None)]
            summary.append(f"R {loc.display} -> {dest.display}{replaced}")
        else:
            plan.append(Step(loc, new_text.encode("utf-8")))
            summary.append(f"M {loc.display}")
    for step in plan:  # every size is checked before the first byte is written
        if step.data is not None:
            check_write_size(ctx, step.loc.display, len(step.data))
    return plan, summary


async def apply_patch_tool(ctx: ToolContext, args: ApplyPatchArgs) -> dict[str, Any]:
    """Apply a multi-file patch; a failure names the file and hunk and changes nothing."""
    files = ctx.files
    try:
        ops = parse(args.input)
    except PatchError as exc:
        raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"patch not understood: {exc}") from exc
    located, touched = _locate_all(files, ops)
    async with AsyncExitStack() as stack:
        for key in sorted(touched):  # sorted: two patches never lock in opposite orders
            await stack.enter_async_context(files.lock(touched[key]))
        before = {key: await _snapshot(files, loc) for key, loc in touched.items()}
        plan, summary = _plan(ctx, located, before)
        await _commit(ctx, plan, before)
    return {"applied": summary}


async def _commit(ctx: ToolContext, plan: list[Step], before: dict[str, Before]) -> None:
    # Each file is replaced atomically; if a write fails half-way, put back every file written.
    done: list[Located] = []
    written: list[tuple[Located, bytes, int]] = []
    try:
        for step in plan:
            if step.data is None:
                await ctx.files.unlink(step.loc)
            else:
                st = await ctx.files.write_raw(step.loc, step.data, step.mode)
                written.append((step.loc, step.data, st.mtime_ns))
            done.append(step.loc)
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            failed = await _restore(ctx, done, before)
        if failed:
            raise SandboxError(
                ErrorCode.INTERNAL,
                f"the patch failed half-way ({exc}) and these files could not be put back: {', '.join(failed)}",
                paths=failed,
            ) from exc
        raise
    for loc, data, mtime_ns in written:
        await ctx.files.states.record(loc.key, data, mtime_ns)


async def _restore(ctx: ToolContext, done: list[Located], before: dict[str, Before]) -> list[str]:
    failed: list[str] = []
    for loc in reversed(done):
        old = before[loc.key]
        try:
            if old.data is not None:
                await ctx.files.write_raw(loc, old.data, old.mode)
            else:
                await ctx.files.unlink(loc)
        except (SandboxError, OSError):
            failed.append(loc.display)
    return failed
