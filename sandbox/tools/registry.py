"""The tool registry: every tool the engine knows, built-in, Python-defined or from skills."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, get_type_hints

from pydantic import Field, create_model

from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.spec import RetryPolicy, Risk, ToolArgs, ToolSpec

Handler = Callable[[Any, Any], Awaitable[Any]]
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}(\.[a-z][a-z0-9_]{0,63})?$")


class ToolRegistry:
    """Tool specs and their handlers, by name; the model's view is cached until a change."""

    def __init__(self, tools: Iterable[tuple[ToolSpec, Handler | None]] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        self._handlers: dict[str, Handler] = {}
        self._model_view: list[dict[str, Any]] | None = None
        for spec, handler in tools:
            self.register(spec, handler)

    def register(self, spec: ToolSpec, handler: Handler | None, *, replace: bool = False) -> None:
        """Add a tool; a name already taken is refused unless `replace`.

        Raises:
            SandboxError: INVALID_ARGUMENTS for a bad name or a duplicate; CONFLICT for a duplicate.
        """
        if not _NAME.match(spec.name):
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS,
                f"tool name {spec.name!r} must be lower_snake_case, optionally namespaced (team.tool)",
            )
        if spec.name in self._specs and not replace:
            raise SandboxError(
                ErrorCode.CONFLICT, f"a tool named {spec.name!r} is already registered; pass replace=True"
            )
        self._specs[spec.name] = spec
        if handler is not None:
            self._handlers[spec.name] = handler
        else:
            self._handlers.pop(spec.name, None)
        self._model_view = None

    def unregister(self, name: str) -> None:
        """Remove a tool (missing is an error: it usually means a typo)."""
        if name not in self._specs:
            raise SandboxError(ErrorCode.TOOL_NOT_FOUND, f"no tool named {name!r} is registered")
        del self._specs[name]
        self._handlers.pop(name, None)
        self._model_view = None

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def get(self, name: str) -> ToolSpec:
        """The spec of a tool (KeyError if unknown)."""
        return self._specs[name]

    def handler(self, name: str) -> Handler | None:
        """The handler of a tool, or None when this build cannot run it."""
        return self._handlers.get(name)

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        return list(self._specs)

    def runnable(self) -> set[str]:
        """Names with a handler."""
        return set(self._handlers)

    def by_category(self, category: str) -> list[ToolSpec]:
        """Specs of one category."""
        return [s for s in self._specs.values() if s.category == category]

    def model_view(self) -> list[dict[str, Any]]:
        """name, description and JSON schema of every runnable tool; no handlers or permissions."""
        if self._model_view is None:
            self._model_view = [
                {"name": s.name, "description": s.description, "parameters": s.json_schema()}
                for s in self._specs.values()
                if s.name in self._handlers
            ]
        return self._model_view

    def tool(
        self,
        name: str | None = None,
        *,
        category: str = "custom",
        risk: Risk = "medium",
        timeout_s: float = 30.0,
        sandboxed: bool = False,
        max_concurrency: int | None = None,
        retry: RetryPolicy | None = None,
        replace: bool = False,
    ) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
        """Register an async function as a tool; its schema comes from its signature and docstring.

        The function takes the ToolContext first, then keyword arguments with annotations and
        defaults; the docstring's first paragraph is the description and its `Args:` section
        describes each argument.
        """

        def decorate(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            params = _args_model(fn)
            doc = inspect.getdoc(fn) or ""
            description = doc.split("\n\n", 1)[0].strip() or (name or fn.__name__)

            async def handler(ctx: Any, args: ToolArgs) -> Any:
                return await fn(ctx, **args.model_dump())

            spec = ToolSpec(
                name=fn.__name__ if name is None else name,
                description=description,
                parameters=params,
                category=category,
                risk=risk,
                timeout_s=timeout_s,
                sandboxed=sandboxed,
                max_concurrency=max_concurrency,
                retry=retry or RetryPolicy(),
            )
            self.register(spec, handler, replace=replace)
            return fn

        return decorate


def _arg_docs(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    match = re.search(r"^\s*Args:\s*$(.*?)(^\s*\w+:\s*$|\Z)", doc, re.S | re.M)
    if match:
        for line in match.group(1).splitlines():
            found = re.match(r"\s*(\w+)(?:\s*\(.*?\))?:\s*(.+)", line)
            if found:
                out[found.group(1)] = found.group(2).strip()
    return out


def _args_model(fn: Callable[..., Any]) -> type[ToolArgs]:
    signature = inspect.signature(fn)
    hints = get_type_hints(fn)
    docs = _arg_docs(inspect.getdoc(fn) or "")
    fields: dict[str, Any] = {}
    for index, (pname, param) in enumerate(signature.parameters.items()):
        if index == 0:
            continue  # the ToolContext
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{fn.__name__}: *args/**kwargs cannot become a tool schema")
        annotation = hints.get(pname, Any)
        default = ... if param.default is param.empty else param.default
        fields[pname] = (annotation, Field(default, description=docs.get(pname)))
    model: type[ToolArgs] = create_model(f"{fn.__name__}_args", __base__=ToolArgs, **fields)
    return model
