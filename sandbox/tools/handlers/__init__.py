"""Handlers of the built-in sandboxed tools, by name."""

from __future__ import annotations

from sandbox.tools.registry import Handler

# the built-in tools this build runs (kept beside their handlers; a test checks they agree), so
# `explain` can say what is provided without importing every handler
PROVIDED_BUILTINS = frozenset(
    {
        "exec",
        "process",
        "read",
        "write",
        "edit",
        "apply_patch",
        "memory_search",
        "memory_get",
        "sessions_spawn",
        "sessions_list",
        "sessions_history",
        "sessions_send",
        "session_status",
        "web_fetch",
        "browser",
        "web_search",
    }
)


def builtin_handlers() -> dict[str, Handler]:
    """name -> handler for every built-in tool this build runs."""
    # here, not at the top: `explain` reads PROVIDED_BUILTINS without loading every handler
    from sandbox.tools.handlers.browser import browser_tool
    from sandbox.tools.handlers.execs import exec_tool
    from sandbox.tools.handlers.files import edit_tool, read_tool, write_tool
    from sandbox.tools.handlers.memory import memory_get_tool, memory_search_tool
    from sandbox.tools.handlers.patch import apply_patch_tool
    from sandbox.tools.handlers.processes import process_tool
    from sandbox.tools.handlers.sessions import (
        session_status_tool,
        sessions_history_tool,
        sessions_list_tool,
        sessions_send_tool,
        sessions_spawn_tool,
    )
    from sandbox.tools.handlers.web import web_fetch_tool, web_search_tool

    return {
        "exec": exec_tool,
        "process": process_tool,
        "read": read_tool,
        "write": write_tool,
        "edit": edit_tool,
        "apply_patch": apply_patch_tool,
        "memory_search": memory_search_tool,
        "memory_get": memory_get_tool,
        "sessions_spawn": sessions_spawn_tool,
        "sessions_list": sessions_list_tool,
        "sessions_history": sessions_history_tool,
        "sessions_send": sessions_send_tool,
        "session_status": session_status_tool,
        "web_fetch": web_fetch_tool,
        "browser": browser_tool,
        "web_search": web_search_tool,
    }
