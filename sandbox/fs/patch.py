"""Patch parsing and in-memory application (pure): the `*** Begin Patch` format and unified diffs.

Application never touches the disk: the tool verifies every hunk of every file first and writes
only when all of them apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


class PatchError(Exception):
    """A patch that cannot be parsed or applied; the message names the file and the hunk."""


@dataclass
class Hunk:
    """One change: the lines to find (old) and what replaces them (new)."""

    anchor: str | None
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    at_eof: bool = False


@dataclass
class FileOp:
    """What a patch does to one file."""

    kind: Literal["add", "delete", "update"]
    path: str
    move_to: str | None = None
    content: str = ""  # for add
    hunks: list[Hunk] = field(default_factory=list)


def parse(text: str) -> list[FileOp]:
    """Parse either format.

    Raises:
        PatchError: with the line number of the problem.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    stripped = [ln for ln in lines if ln.strip()]
    if stripped and stripped[0].strip() == "*** Begin Patch":
        return _parse_codex(lines)
    if any(ln.startswith("--- ") for ln in lines) and any(ln.startswith("+++ ") for ln in lines):
        return _parse_unified(lines)
    raise PatchError("not a patch: expected '*** Begin Patch' or a unified diff ('--- a/x', '+++ b/x', '@@')")


def _parse_codex(lines: list[str]) -> list[FileOp]:
    ops: list[FileOp] = []
    i = next(n for n, ln in enumerate(lines) if ln.strip()) + 1
    current: FileOp | None = None
    hunk: Hunk | None = None
    ended = False
    while i < len(lines):
        line = lines[i]
        n = i + 1
        i += 1
        if line.strip() == "*** End Patch":
            ended = True
            break
        if line.startswith("*** Add File: "):
            current, hunk = FileOp("add", line[len("*** Add File: ") :].strip()), None
            ops.append(current)
        elif line.startswith("*** Delete File: "):
            current, hunk = FileOp("delete", line[len("*** Delete File: ") :].strip()), None
            ops.append(current)
        elif line.startswith("*** Update File: "):
            current, hunk = FileOp("update", line[len("*** Update File: ") :].strip()), None
            ops.append(current)
        elif line.startswith("*** Move to: "):
            if current is None or current.kind != "update":
                raise PatchError(f"line {n}: '*** Move to' outside an Update File section")
            current.move_to = line[len("*** Move to: ") :].strip()
        elif line.strip() == "*** End of File":
            if hunk is not None:
                hunk.at_eof = True
        elif current is None:
            if line.strip():
                raise PatchError(f"line {n}: expected a '*** Add/Update/Delete File:' header, got {line!r}")
        elif current.kind == "add":
            if not line.startswith("+"):
                if not line.strip():
                    continue
                raise PatchError(f"line {n}: lines of an added file must start with '+' ({current.path})")
            current.content += line[1:] + "\n"
        elif current.kind == "delete":
            if line.strip():
                raise PatchError(f"line {n}: unexpected text after '*** Delete File: {current.path}'")
        else:
            if line.startswith("@@"):
                anchor = line[2:].strip() or None
                hunk = Hunk(anchor=anchor)
                current.hunks.append(hunk)
                continue
            if hunk is None:
                hunk = Hunk(anchor=None)
                current.hunks.append(hunk)
            if line.startswith("+"):
                hunk.new.append(line[1:])
            elif line.startswith("-"):
                hunk.old.append(line[1:])
            elif line.startswith(" ") or line == "":
                hunk.old.append(line[1:])
                hunk.new.append(line[1:])
            else:
                raise PatchError(f"line {n}: hunk lines start with ' ', '-' or '+', got {line!r} ({current.path})")
    if not ended:
        raise PatchError("the patch has no '*** End Patch' line")
    for op in ops:
        if op.kind == "update" and not op.hunks and not op.move_to:
            raise PatchError(f"'*** Update File: {op.path}' has no hunks")
        if not op.path:
            raise PatchError("a file header has an empty path")
        for hunk in op.hunks:
            while hunk.old and hunk.new and hunk.old[-1] == "" and hunk.new[-1] == "":
                hunk.old.pop()
                hunk.new.pop()
    return ops


def _strip_prefix(path: str) -> str:
    path = path.split("\t")[0].strip()
    return path[2:] if path.startswith(("a/", "b/")) else path


def _parse_unified(lines: list[str]) -> list[FileOp]:
    ops: list[FileOp] = []
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old_path = _strip_prefix(lines[i][4:])
        new_path = _strip_prefix(lines[i + 1][4:])
        i += 2
        if old_path == "/dev/null":
            op = FileOp("add", new_path)
        elif new_path == "/dev/null":
            op = FileOp("delete", old_path)
        else:
            op = FileOp("update", old_path, move_to=new_path if new_path != old_path else None)
        ops.append(op)
        hunk: Hunk | None = None
        while i < len(lines) and not (
            lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        ):
            line = lines[i]
            i += 1
            if line.startswith("@@"):
                hunk = Hunk(anchor=None)
                op.hunks.append(hunk)
            elif hunk is None or line.startswith("\\"):
                continue
            elif line.startswith("+"):
                hunk.new.append(line[1:])
            elif line.startswith("-"):
                hunk.old.append(line[1:])
            elif line.startswith(" "):
                hunk.old.append(line[1:])
                hunk.new.append(line[1:])
            elif line == "" and i < len(lines):
                hunk.old.append("")
                hunk.new.append("")
        if op.kind == "add":
            op.content = "".join(ln + "\n" for h in op.hunks for ln in h.new)
            op.hunks = []
    if not ops:
        raise PatchError("the unified diff names no file")
    return ops


def _find(lines: list[str], needle: list[str], start: int, at_eof: bool) -> int:
    if not needle:
        return len(lines) if at_eof else start
    candidates = [len(lines) - len(needle)] if at_eof else range(start, len(lines) - len(needle) + 1)
    for normalise in (lambda s: s, str.rstrip, str.strip):
        target = [normalise(x) for x in needle]
        for pos in candidates:
            if pos >= 0 and [normalise(x) for x in lines[pos : pos + len(needle)]] == target:
                return pos
    return -1


def apply_hunks(path: str, text: str, hunks: list[Hunk]) -> str:
    """Apply hunks in order to `text`.

    Raises:
        PatchError: naming the file and the 1-based hunk that does not apply, with its first lines.
    """
    trailing_newline = text.endswith("\n") or text == ""
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    cursor = 0
    for number, hunk in enumerate(hunks, 1):
        if hunk.anchor:
            anchor = next((k for k in range(cursor, len(lines)) if hunk.anchor.strip() in lines[k]), -1)
            if anchor < 0:
                raise PatchError(f"{path}: hunk {number}: anchor {hunk.anchor!r} not found")
            cursor = anchor if hunk.old and hunk.old[0].strip() == hunk.anchor.strip() else anchor + 1
        pos = _find(lines, hunk.old, cursor, hunk.at_eof)
        if pos < 0:
            preview = "\n".join(hunk.old[:3])
            raise PatchError(f"{path}: hunk {number} does not apply: these lines were not found:\n{preview}")
        lines[pos : pos + len(hunk.old)] = hunk.new
        cursor = pos + len(hunk.new)
    out = "\n".join(lines)
    return out + "\n" if trailing_newline and lines else out
