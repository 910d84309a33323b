"""A tenant is always named: no parameter lets a missing one pass as tenant "default" (STYLE §16)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from sandbox.engine.orchestrator import Orchestrator
from sandbox.runtime.naming import container_name

PACKAGE = Path(__file__).resolve().parents[1] / "sandbox"


def test_a_container_name_without_a_tenant_is_a_type_error() -> None:
    """container_name refuses to be called without the tenant whose container it names."""
    with pytest.raises(TypeError, match="tenant"):
        container_name("i", "exec", "shared")  # type: ignore[call-arg]
    assert container_name("i", "exec", "shared", tenant="a") != container_name("i", "exec", "shared", tenant="b")


def test_inbox_and_children_need_the_sessions_tenant() -> None:
    """Orchestrator.children and .messages take the tenant with no default: a caller must pass it."""
    for method in (Orchestrator.children, Orchestrator.messages):
        assert inspect.signature(method).parameters["tenant"].default is inspect.Parameter.empty, method


@pytest.mark.slow
def test_no_function_defaults_a_tenant_to_a_name() -> None:
    """No function in the package gives a `tenant` parameter a string default (None, 'no tenant', is allowed)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args
            pairs = list(zip(reversed(args.args + args.posonlyargs), reversed(args.defaults), strict=False))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            for arg, default in pairs:
                named = isinstance(default, ast.Constant) and isinstance(default.value, str)
                if arg.arg == "tenant" and (named or isinstance(default, ast.Name | ast.Attribute)):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert found == []
