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
class ParsedDocument:
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
    """The file is not valid YAML (or repeats a key, or expands too far).

    Each of `problems` reads `file:line:col: problem`; the message is the first.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems[0])
        self.problems = problems


# A real config has a few hundred nodes and nests under 10 deep. Aliases let 300 bytes stand
# for millions of nodes (every later walk of the data pays for each), so the bound is on the
# expanded document, computed while composing, before anything walks it.
MAX_NODES = 100_000
MAX_DEPTH = 64
_MERGE_TAG = "tag:yaml.org,2002:merge"


class BoundError(yaml.MarkedYAMLError):
    """The document is valid YAML but past the loader's bounds (or a recursive alias)."""

    def __init__(self, problem: str, mark: yaml.Mark) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses alias bombs, recursive aliases and deep nesting while composing,
    and collects repeated keys (`line:col: problem` each) instead of letting the last one win."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.duplicates: list[str] = []
        self._size: dict[int, int] = {}  # id(node) -> nodes once every alias is expanded
        self._depth: dict[int, int] = {}  # id(node) -> expanded depth
        self._level = 0  # collections being composed around the next node

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event: Any = self.peek_event()  # type: ignore[no-untyped-call]
            target = self.anchors.get(event.anchor) if event.anchor is not None else None
            # a collection is sized when it is complete: an alias to an unsized one is inside it
            if target is not None and not isinstance(target, yaml.ScalarNode) and id(target) not in self._size:
                raise BoundError(f"recursive alias *{event.anchor} (the anchor contains itself)", event.start_mark)
        elif self._level >= MAX_DEPTH:
            raise BoundError(f"nested deeper than {MAX_DEPTH} levels", self._next_mark())
        return super().compose_node(parent, index)

    def compose_sequence_node(self, anchor: Any) -> yaml.SequenceNode:
        node: yaml.SequenceNode = self._bounded(super().compose_sequence_node, anchor)
        return node

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
        node: yaml.MappingNode = self._bounded(super().compose_mapping_node, anchor)
        self._check_duplicates(node)
        return node

    def _next_mark(self) -> yaml.Mark:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        mark: yaml.Mark = event.start_mark
        return mark

    def _bounded(self, compose: Any, anchor: Any) -> Any:
        start = self._next_mark()
        self._level += 1
        try:
            node = compose(anchor)
        finally:
            self._level -= 1
        children = [c for pair in node.value for c in (pair if isinstance(pair, tuple) else (pair,))]
        size = 1 + sum(self._size.get(id(c), 1) for c in children)
        depth = 1 + max((self._depth.get(id(c), 1) for c in children), default=0)
        self._size[id(node)], self._depth[id(node)] = size, depth
        if size > MAX_NODES:
            raise BoundError(f"aliases expand this to more than {MAX_NODES} nodes (an alias bomb?)", start)
        if depth > MAX_DEPTH:
            raise BoundError(f"aliases expand this deeper than {MAX_DEPTH} levels", start)
        return node

    def _check_duplicates(self, node: yaml.MappingNode) -> None:
        first: dict[object, yaml.Mark] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            try:  # `true` and `yes`, `1` and `0x1` are one key once constructed
                key: object = (key_node.tag, self.construct_object(key_node))
            except (yaml.YAMLError, TypeError, ValueError):
                key = (key_node.tag, key_node.value)
            mark = key_node.start_mark
            if key in first:
                was = first[key]
                self.duplicates.append(
                    f"{mark.line + 1}:{mark.column + 1}: duplicate key {key_node.value!r} "
                    f"(first at line {was.line + 1}:{was.column + 1}); keys may appear once per mapping"
                )
            else:
                first[key] = mark


def parse(text: str, source: str) -> ParsedDocument:
    """Parse YAML (or JSON) text, keeping positions of every key path.

    Raises:
        YamlSyntaxError: the text is not valid YAML, repeats a key in one mapping, or its
            aliases expand past :data:`MAX_NODES` or :data:`MAX_DEPTH`.
    """
    try:
        # the reader checks the characters when the loader is made (a NUL byte is refused here)
        loader = BoundedLoader(text)
    except yaml.YAMLError as exc:
        raise YamlSyntaxError([f"{source}: YAML syntax error: {exc}"]) from exc
    try:
        node = loader.get_single_node()
        if loader.duplicates:
            raise YamlSyntaxError([f"{source}:{problem}" for problem in loader.duplicates])
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        kind = "config refused" if isinstance(exc, BoundError) else "YAML syntax error"
        raise YamlSyntaxError([f"{where}: {kind}: {exc.problem or exc}"]) from exc
    finally:
        loader.dispose()
    keys: dict[Loc, Position] = {}
    values: dict[Loc, Position] = {}
    if node is not None:
        _walk(node, (), keys, values)
    return ParsedDocument(data=data, positions=keys, values=values, source=source)


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


def read(path: Path) -> ParsedDocument:
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
