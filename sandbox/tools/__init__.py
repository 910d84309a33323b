"""Tools: specs and results, the built-in catalog, vendor formats."""

from sandbox.tools.builtin import BUILTIN_BY_NAME, BUILTIN_SPECS
from sandbox.tools.formats import render
from sandbox.tools.spec import ErrorInfo, ToolArgs, ToolResult, ToolSpec

__all__ = [
    "BUILTIN_BY_NAME",
    "BUILTIN_SPECS",
    "ErrorInfo",
    "ToolArgs",
    "ToolResult",
    "ToolSpec",
    "render",
]
