"""The tool registry and the decorator for Python-defined tools (pure, fast)."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import ValidationError

from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools import BUILTIN_SPECS
from sandbox.tools.registry import ToolRegistry


def test_register_duplicate_unregister_and_cache() -> None:
    """Duplicates are refused unless replace; the model view is rebuilt after a change."""
    reg = ToolRegistry((s, None) for s in BUILTIN_SPECS)

    @reg.tool(category="math")
    async def add(ctx: Any, a: int, b: int = 2) -> int:
        """Add two numbers."""
        return a + b

    view = reg.model_view()
    assert [t["name"] for t in view] == ["add"]
    assert reg.model_view() is view  # cached
    with pytest.raises(SandboxError) as info:
        reg.register(reg.get("add"), None)
    assert info.value.code == ErrorCode.CONFLICT
    reg.register(reg.get("add"), None, replace=True)
    assert reg.model_view() == [] and reg.model_view() is not view
    reg.unregister("add")
    assert "add" not in reg
    with pytest.raises(SandboxError):
        reg.unregister("add")


def test_decorator_derives_schema_from_signature_and_docstring() -> None:
    """Types, defaults, required fields, enums and Args: descriptions become the JSON schema."""
    reg = ToolRegistry()

    @reg.tool("team.count_lines", category="file", risk="low")
    async def count(ctx: Any, path: str, mode: Literal["lines", "words"] = "lines", limit: int | None = None) -> int:
        """Count lines or words in a file.

        Args:
            path: file to count, relative to the workspace.
            mode: what to count.
        """
        return 0

    spec = reg.get("team.count_lines")
    schema = spec.json_schema()
    assert spec.description == "Count lines or words in a file."
    assert schema["required"] == ["path"]
    assert schema["properties"]["path"]["description"] == "file to count, relative to the workspace."
    assert schema["properties"]["mode"]["enum"] == ["lines", "words"]
    assert schema["additionalProperties"] is False
    assert [s.name for s in reg.by_category("file")] == ["team.count_lines"]
    with pytest.raises(ValidationError):
        spec.parameters.model_validate({"path": "x", "mode": "bytes"})


def test_bad_names_refused() -> None:
    """Names must be lower_snake_case, optionally one namespace."""
    reg = ToolRegistry()
    for bad in ("Bad", "a-b", "a.b.c", ""):
        with pytest.raises(SandboxError):

            @reg.tool(bad)
            async def t(ctx: Any) -> None:
                """x"""
