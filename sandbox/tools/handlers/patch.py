"""apply_patch: verify every hunk of every file in memory, then write; all or nothing."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio.to_thread

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.locks import file_lock
from sandbox.fs.patch import PatchError, apply_hunks, parse
from sandbox.fs.workspace import Located
from sandbox.tools.builtin import ApplyPatchArgs
from sandbox.tools.context import ToolContext
from sandbox.tools.handlers.files import decode_text


async def apply_patch_tool(ctx: ToolContext, args: ApplyPatchArgs) -> dict[str, Any]:
    """Apply a multi-file patch; a failure names the file and hunk and changes nothing."""
    files = ctx.files
    try:
        ops = parse(args.input)
    except PatchError as exc:
        raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"patch not understood: {exc}") from exc
    plan: list[tuple[Located, bytes | None]] = []  # (where, new content or None to delete)
    summary: list[str] = []
    touched: dict[str, Located] = {}
    for op in ops:
        loc = files.locate(op.path)
        files.check_writable(loc)
        touched[loc.key] = loc
        if op.move_to:
            dest = files.locate(op.move_to)
            files.check_writable(dest)
            touched[dest.key] = dest
    async with AsyncExitStack() as stack:
        for key in sorted(touched):  # sorted: two patches never lock in opposite orders
            await stack.enter_async_context(file_lock(files.lock_dir, key))
        originals: dict[str, bytes | None] = {}
        for op in ops:
            loc = files.locate(op.path)
            safe = files.safe(loc)
            exists = await anyio.to_thread.run_sync(safe.stat, loc.path)
            if op.kind == "add":
                if exists is not None:
                    raise SandboxError(
                        ErrorCode.CONFLICT,
                        f"{loc.display}: Add File, but it already exists; use Update File",
                    )
                plan.append((loc, op.content.encode("utf-8")))
                summary.append(f"A {loc.display}")
                continue
            if exists is None:
                raise SandboxError(ErrorCode.FILE_NOT_FOUND, f"{loc.display}: no such file to {op.kind}")
            data, _ = await anyio.to_thread.run_sync(safe.read_bytes, loc.path, files.fs.max_read_bytes)
            originals[loc.key] = data
            if op.kind == "delete":
                plan.append((loc, None))
                summary.append(f"D {loc.display}")
                continue
            try:
                new_text = apply_hunks(loc.display, decode_text(data, loc.display), op.hunks)
            except PatchError as exc:
                raise SandboxError(
                    ErrorCode.INVALID_ARGUMENTS, f"patch does not apply, nothing changed: {exc}"
                ) from exc
            if op.move_to:
                dest = files.locate(op.move_to)
                plan += [(dest, new_text.encode("utf-8")), (loc, None)]
                summary.append(f"R {loc.display} -> {dest.display}")
            else:
                plan.append((loc, new_text.encode("utf-8")))
                summary.append(f"M {loc.display}")
        await _commit(ctx, plan, originals)
    return {"applied": summary}


async def _commit(
    ctx: ToolContext, plan: list[tuple[Located, bytes | None]], originals: dict[str, bytes | None]
) -> None:
    # Each file is replaced atomically; if the disk fails half-way, put back what was written.
    done: list[Located] = []
    try:
        for loc, data in plan:
            safe = ctx.files.safe(loc)
            if data is None:
                await anyio.to_thread.run_sync(safe.unlink, loc.path)
            else:
                st = await anyio.to_thread.run_sync(safe.write_atomic, loc.path, data)
                ctx.files.states.record(loc.key, data, st.mtime_ns)
            done.append(loc)
    except BaseException:
        with anyio.CancelScope(shield=True):
            for loc in reversed(done):
                old = originals.get(loc.key)
                safe = ctx.files.safe(loc)
                if old is not None:
                    await anyio.to_thread.run_sync(safe.write_atomic, loc.path, old)
                elif loc.key not in originals:
                    await anyio.to_thread.run_sync(safe.unlink, loc.path)
        raise
