"""MkDocs hook: the reference tables that are generated rather than written, so they never
drift from the code. A page asks for one with a marker line:

- `<!-- generated: readme -->`: the README (the site's home page is the repository's front page,
  its links made relative to `docs/`);
- `<!-- generated: config-keys -->`: every key of the config file, from the pydantic models
  (`sandbox.config.models.Config`): its path, type and default;
- `<!-- generated: http-routes -->`: every route of `sandbox serve`, from the OpenAPI document
  the service itself serves (`/openapi.json`): method, path and what it does.

The CLI's reference comes from the commands themselves through the `mkdocs-click` extension.
"""

from __future__ import annotations

import enum
import types
import typing
from pathlib import Path, PurePath
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

README_MARK = "<!-- generated: readme -->"
CONFIG_MARK = "<!-- generated: config-keys -->"
ROUTES_MARK = "<!-- generated: http-routes -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if README_MARK in markdown:
        markdown = markdown.replace(README_MARK, readme())
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_keys())
    if ROUTES_MARK in markdown:
        markdown = markdown.replace(ROUTES_MARK, http_routes())
    return markdown


def readme() -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    return text.replace("](docs/", "](")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _model_in(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field holds (directly, in a list, or as a dict's values) and the path suffix."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        found = [m for a in args if a is not type(None) and (m := _model_in(a)) is not None]
        return found[0] if len(found) == 1 else None
    if origin is list and args:
        inner = _model_in(args[0])
        return (inner[0], "[]" + inner[1]) if inner else None
    if origin is dict and len(args) == 2:
        inner = _model_in(args[1])
        return (inner[0], ".<name>" + inner[1]) if inner else None
    return None


def _type_name(annotation: Any) -> str:
    """A type as a reader of the config file thinks of it (validators and wrappers left out)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (list, tuple, set, frozenset, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args if a is not Ellipsis)}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return {"Path": "path", "str": "str", "int": "int", "float": "float", "bool": "bool"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation).replace("typing.", "")


def _default(field: Any) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:  # a factory that needs the validated data
            return "(computed)"
        if isinstance(value, BaseModel):
            return ""
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, PurePath):
        value = str(value)
    return f"`{value!r}`" if value not in (None, [], {}) else ("" if value is None else f"`{value!r}`")


def _rows(model: type[BaseModel], prefix: str, seen: tuple[type[BaseModel], ...]) -> list[str]:
    rows: list[str] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}{key}"
        nested = _model_in(field.annotation)
        if nested is not None and nested[0] not in seen:
            rows.append(f"| `{path}` | {_cell(nested[0].__name__)} | {_cell(_default(field))} |")
            rows.extend(_rows(nested[0], f"{path}{nested[1]}.", (*seen, nested[0])))
        else:
            rows.append(f"| `{path}` | `{_cell(_type_name(field.annotation))}` | {_cell(_default(field))} |")
    return rows


def config_keys() -> str:
    from sandbox.config.models import Config

    rows = _rows(Config, "", (Config,))
    return "\n".join(["| key | type | default |", "|---|---|---|", *rows])


def http_routes() -> str:
    from sandbox.api.app import create_app
    from sandbox.config.models import Config

    config = Config.model_validate({"tenants": [{"id": "docs", "tokens": [{"name": "docs", "sha256": "0" * 64}]}]})
    spec = create_app(config).openapi()
    rows = ["| method | path | what it does |", "|---|---|---|"]
    for path, methods in spec.get("paths", {}).items():
        for method, operation in methods.items():
            summary = operation.get("summary") or ""
            described = (operation.get("description") or "").strip().split("\n\n")[0]
            rows.append(f"| {method.upper()} | `{_cell(path)}` | {_cell(described or summary)} |")
    return "\n".join(rows)
