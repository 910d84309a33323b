"""Key normalisation against the models: camelCase aliases, unknown keys with suggestions."""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from sandbox.config.locate import Loc

_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")


def camel_to_snake(name: str) -> str:
    """`workspaceAccess` -> `workspace_access`; snake_case passes through."""
    return _CAMEL.sub(r"_\1", name).lower()


def snake_to_camel(name: str) -> str:
    """`workspace_access` -> `workspaceAccess`."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _child_schema(annotation: Any) -> tuple[str, Any] | None:
    """Describe what lies under a field: a model, a list of X or a dict of X."""
    annotation = _unwrap(annotation)
    origin = get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return ("model", annotation)
    if origin is list:
        return ("list", get_args(annotation)[0])
    if origin is dict:
        return ("dict", get_args(annotation)[1])
    return None


def normalize(data: Any, model: type[BaseModel], loc: Loc = ()) -> tuple[Any, list[tuple[Loc, str]]]:
    """Rename camelCase keys to snake_case and report unknown keys.

    Returns:
        The normalised data and a list of (key path, problem) for every unknown key.
    """
    problems: list[tuple[Loc, str]] = []
    if not isinstance(data, dict):
        return data, problems
    fields = model.model_fields
    out: dict[Any, Any] = {}
    for key, value in data.items():
        name = key if isinstance(key, str) else str(key)
        target = name if name in fields else camel_to_snake(name)
        if target not in fields:
            problems.append(((*loc, name), _unknown_key_message(name, list(fields))))
            continue
        if target in out:
            problems.append(((*loc, name), f"key {name!r} repeats {target!r}"))
            continue
        schema = _child_schema(fields[target].annotation)
        value, sub = _normalize_value(value, schema, (*loc, target))
        problems.extend(sub)
        out[target] = value
    return out, problems


def _normalize_value(value: Any, schema: tuple[str, Any] | None, loc: Loc) -> tuple[Any, list[tuple[Loc, str]]]:
    if schema is None:
        return value, []
    kind, inner = schema
    if kind == "model":
        return normalize(value, inner, loc)
    inner_schema = _child_schema(inner)
    if inner_schema is None:
        return value, []
    problems: list[tuple[Loc, str]] = []
    if kind == "list" and isinstance(value, list):
        items = []
        for index, item in enumerate(value):
            item, sub = _normalize_value(item, inner_schema, (*loc, index))
            problems.extend(sub)
            items.append(item)
        return items, problems
    if kind == "dict" and isinstance(value, dict):
        mapping = {}
        for key, item in value.items():
            item, sub = _normalize_value(item, inner_schema, (*loc, str(key)))
            problems.extend(sub)
            mapping[key] = item
        return mapping, problems
    return value, problems


def _unknown_key_message(name: str, valid: list[str]) -> str:
    import difflib  # only a config with a mistake pays for it

    candidates = {field: field for field in valid}
    candidates.update({snake_to_camel(field): field for field in valid})
    near = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    if not near:
        near = difflib.get_close_matches(camel_to_snake(name), valid, n=1, cutoff=0.6)
    if near:
        return f"unknown key {name!r}; did you mean {candidates.get(near[0], near[0])!r}?"
    return f"unknown key {name!r} (valid keys here: {', '.join(valid)})"
