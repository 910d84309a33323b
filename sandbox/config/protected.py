"""Protected-path patterns (`tools.fs.protected_paths`): parsing and matching, shared by the
file tools (refuse writes) and the runtime (read-only mounts). `**` spans directories."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

GLOB_CHARS = frozenset("*?[")


def pattern_parts(pattern: str) -> tuple[str, ...] | None:
    """The components of a protected-path pattern; None for one that can never match safely."""
    parts = tuple(p for p in pattern.strip().strip("/").split("/") if p)
    if not parts or any(p in (".", "..") for p in parts):
        return None
    return parts


def is_glob(parts: Sequence[str]) -> bool:
    """Whether a pattern has wildcards."""
    return any(GLOB_CHARS & set(p) for p in parts)


def match_parts(pattern: Sequence[str], path: Sequence[str]) -> bool:
    """Whether `path` matches `pattern` exactly; `**` matches any number of components (zero too)."""
    if not pattern:
        return not path
    head, *rest = pattern
    if head == "**":
        return any(match_parts(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], head) and match_parts(rest, path[1:])


def is_protected(patterns: Sequence[str], rel: str) -> str | None:
    """The pattern protecting `rel` (the path itself or one of its parents), or None."""
    path = tuple(p for p in rel.split("/") if p)
    for pattern in patterns:
        parts = pattern_parts(pattern)
        if parts is None:
            continue
        if any(match_parts(parts, path[:cut]) for cut in range(1, len(path) + 1)):
            return pattern
    return None
