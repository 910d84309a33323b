"""Tool definitions in each vendor's function-calling shape."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from sandbox.tools.spec import ToolSpec

Format = Literal["openai", "anthropic", "mcp"]


def render(specs: Iterable[ToolSpec], fmt: Format) -> list[dict[str, Any]]:
    """Render specs as OpenAI `tools`, Anthropic `tools` or MCP `tools/list` entries."""
    out: list[dict[str, Any]] = []
    for spec in specs:
        schema = spec.json_schema()
        if fmt == "openai":
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": spec.name,
                        "description": spec.description,
                        "parameters": schema,
                    },
                }
            )
        elif fmt == "anthropic":
            out.append({"name": spec.name, "description": spec.description, "input_schema": schema})
        else:
            out.append({"name": spec.name, "description": spec.description, "inputSchema": schema})
    return out
