"""How a tool call looks to a person: an emoji, a title and the one argument that says the most."""

from __future__ import annotations

from typing import Any

_DISPLAY: dict[str, tuple[str, str, str | None]] = {
    "exec": ("🔨", "exec", "command"),
    "process": ("⚙️", "process", "action"),
    "read": ("📖", "read", "path"),
    "write": ("✍️", "write", "path"),
    "edit": ("📝", "edit", "path"),
    "apply_patch": ("🩹", "apply_patch", None),
    "browser": ("🌐", "browser", "url"),
    "canvas": ("🖼️", "canvas", "action"),
    "web_fetch": ("📥", "web_fetch", "url"),
    "web_search": ("🔎", "web_search", "query"),
    "memory_search": ("🧠", "memory_search", "query"),
    "memory_get": ("🧠", "memory_get", "path"),
    "sessions_list": ("🗂️", "sessions_list", None),
    "sessions_history": ("📜", "sessions_history", "session"),
    "sessions_send": ("📨", "sessions_send", "session"),
    "sessions_spawn": ("🐣", "sessions_spawn", "task"),
    "session_status": ("ℹ️", "session_status", None),
    "cron": ("⏰", "cron", "action"),
    "gateway": ("🚪", "gateway", "action"),
    "message": ("💬", "message", "to"),
    "nodes": ("📡", "nodes", "action"),
}
_FALLBACK = ("🧩", None, None)


def describe(tool: str, args: Any, width: int = 80) -> str:
    """`🔨 exec  ls -la`: one line for a call (a fallback for skill and unknown tools)."""
    emoji, title, field = _DISPLAY.get(tool, _FALLBACK)
    detail = ""
    if isinstance(args, dict):
        if field and field in args:
            detail = str(args[field])
        elif tool == "apply_patch" and isinstance(args.get("input"), str):
            files = [
                ln.split(":", 1)[1].strip() for ln in args["input"].splitlines() if ln.startswith("*** ") and ": " in ln
            ]
            detail = ", ".join(files)
        elif tool == "process" and "id" in args:
            detail = f"{args.get('action', '')} {args['id']}"
        elif not field and args:
            first = next(iter(args.items()))
            detail = f"{first[0]}={first[1]}"
        if tool == "process" and "id" in args:
            detail = f"{args.get('action', '')} {args['id']}"
    detail = " ".join(detail.split())
    if len(detail) > width:
        detail = detail[: width - 1] + "…"
    return f"{emoji} {title or tool:<12} {detail}".rstrip()
