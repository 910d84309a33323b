"""read, write and edit: host-side through the symlink-proof walk, with every fs rule applied."""

from __future__ import annotations

from typing import Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.builtin import EditArgs, ReadArgs, WriteArgs
from sandbox.tools.context import ToolContext


def decode_text(data: bytes, display: str) -> str:
    """UTF-8 text, or a clear refusal for binary content."""
    if b"\x00" in data[:8192]:
        raise SandboxError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{display}: is a binary file ({len(data):,} bytes); read only handles text",
            path=display,
            size=len(data),
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SandboxError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{display}: is not UTF-8 text ({len(data):,} bytes; invalid byte at offset {exc.start})",
            path=display,
            size=len(data),
        ) from exc


def check_write_size(ctx: ToolContext, display: str, size: int) -> None:
    """Refuse, before anything is written, a file that would be larger than tools.fs.max_write_bytes."""
    cap = ctx.files.fs.max_write_bytes
    if size > cap:
        raise SandboxError(
            ErrorCode.QUOTA_EXCEEDED,
            f"{display}: the result would be {size:,} bytes, over tools.fs.max_write_bytes ({cap:,} bytes); "
            "nothing was written",
            path=display,
            size=size,
            max_write_bytes=cap,
        )


async def read_tool(ctx: ToolContext, args: ReadArgs) -> dict[str, Any]:
    """Read lines `offset`..`offset+limit` of a text file."""
    loc = ctx.files.locate(args.path)
    data, st = await ctx.files.read(loc)
    text = decode_text(data, loc.display)
    lines = text.splitlines(keepends=True)
    end = len(lines) if args.limit is None else min(len(lines), args.offset + args.limit)
    chosen = lines[args.offset : end]
    if args.line_numbers:
        width = len(str(end))
        content = "".join(f"{n:>{width}}\t{line}" for n, line in enumerate(chosen, args.offset + 1))
    else:
        content = "".join(chosen)
    return {
        "path": loc.display,
        "content": content,
        "total_lines": len(lines),
        "offset": args.offset,
        "lines_returned": len(chosen),
        "size": st.size,
    }


async def write_tool(ctx: ToolContext, args: WriteArgs) -> dict[str, Any]:
    """Create or replace a file atomically."""
    loc = ctx.files.locate(args.path)
    data = args.content.encode("utf-8")
    check_write_size(ctx, loc.display, len(data))
    await ctx.files.write(loc, data)
    return {"path": loc.display, "bytes_written": len(data)}


async def edit_tool(ctx: ToolContext, args: EditArgs) -> dict[str, Any]:
    """Replace `old_string` (exactly once, unless replace_all) under the file's write lock."""
    files = ctx.files
    loc = files.locate(args.path)
    files.check_writable(loc)
    async with files.lock(loc):
        data, _ = await files.read_raw(loc)
        if await files.changed_since_seen(loc, data):
            raise SandboxError(
                ErrorCode.CONFLICT,
                f"{loc.display}: changed since this session last read or wrote it; read it again, then edit",
                path=loc.display,
            )
        text = decode_text(data, loc.display)
        count = text.count(args.old_string)
        if count == 0:
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS,
                f"{loc.display}: old_string occurs 0 times; read the file and copy the text exactly",
                path=loc.display,
                occurrences=0,
            )
        if count > 1 and not args.replace_all:
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS,
                f"{loc.display}: old_string occurs {count} times; add context to make it unique, or set replace_all",
                path=loc.display,
                occurrences=count,
            )
        # the size is known before the text is built: a replace_all that would blow a file up to
        # hundreds of megabytes is refused without ever allocating it
        grows = len(args.new_string.encode("utf-8")) - len(args.old_string.encode("utf-8"))
        check_write_size(ctx, loc.display, len(data) + grows * (count if args.replace_all else 1))
        new_text = (
            text.replace(args.old_string, args.new_string)
            if args.replace_all
            else text.replace(args.old_string, args.new_string, 1)
        )
        new_data = new_text.encode("utf-8")
        st = await files.write_raw(loc, new_data)
    await files.states.record(loc.key, new_data, st.mtime_ns)
    return {"path": loc.display, "replacements": count if args.replace_all else 1}
