"""YAML with positions: parse a config and remember where every key and value came from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Position:
    """A 1-based line and column in a config file."""

    line: int
    column: int


@dataclass(frozen=True)
class Located:
    """A parsed document and the position of every key path in it."""

    data: Any
    positions: dict[Loc, Position]  # where each key is written
    values: dict[Loc, Position]  # where each value starts
    source: str

    def position(self, loc: Loc, *, value: bool = False) -> Position | None:
        """The position of the deepest known prefix of `loc` (its value, or its key)."""
        table = self.values if value else self.positions
        for cut in range(len(loc), -1, -1):
            pos = table.get(tuple(loc[:cut]))
            if pos is not None:
                return pos
        return None

    def where(self, loc: Loc, *, value: bool = False) -> str:
        """Return `file:line:col` for `loc` (see :meth:`position`)."""
        pos = self.position(loc, value=value)
        return f"{self.source}:{pos.line}:{pos.column}" if pos else self.source


class YamlSyntaxError(Exception):
    """The file is not valid YAML; the message is `file:line:col: problem`."""


def parse(text: str, source: str) -> Located:
    """Parse YAML (or JSON) text, keeping positions of every key path.

    Raises:
        YamlSyntaxError: the text is not valid YAML.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise YamlSyntaxError(f"{where}: YAML syntax error: {exc.problem or exc}") from exc
    finally:
        loader.dispose()
    keys: dict[Loc, Position] = {}
    values: dict[Loc, Position] = {}
    if node is not None:
        _walk(node, (), keys, values)
    return Located(data=data, positions=keys, values=values, source=source)


def _walk(node: yaml.Node, loc: Loc, keys: dict[Loc, Position], values: dict[Loc, Position]) -> None:
    here = Position(node.start_mark.line + 1, node.start_mark.column + 1)
    values[loc] = here
    keys.setdefault(loc, here)  # list items have no key: point at the item
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            child = (*loc, str(key_node.value))
            keys[child] = Position(key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _walk(value_node, child, keys, values)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*loc, index), keys, values)


def read(path: Path) -> Located:
    """Read and parse a config file."""
    return parse(path.read_text(encoding="utf-8"), str(path))


def format_loc(loc: Loc) -> str:
    """Render a key path the way a user writes it: `agents.list[0].sandbox.mode`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"
