"""Bounding tool-call arguments before anything recursive (journal, validation) touches them.

Text that is not valid Unicode (a lone surrogate, which JSON's `\\ud800` escapes can carry) is
refused here too: no file, command or log can hold it, and it crashed the handler that encoded it.

Arguments nested a few hundred levels deep overflow Python's recursion in the journal's redaction,
in `json.dumps` and in pydantic; megabytes of them fill memory and the journal. This walk is
iterative and stops at the first limit crossed, so it is safe on any input.
"""

from __future__ import annotations

from typing import Any

from sandbox.errors import ErrorCode, SandboxError

MAX_DEPTH = 32
MAX_BYTES = 1024 * 1024
_SCALAR_BYTES = 8  # numbers, booleans, null: about what they take in JSON


def _size(value: Any) -> int:
    if isinstance(value, str):
        try:
            return len(value.encode("utf-8")) + 2
        except UnicodeEncodeError as exc:  # a lone surrogate (a JSON "\ud800"): no tool can write it
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS,
                f"arguments hold text that is not valid Unicode (a lone surrogate at character {exc.start} "
                "of a string); send UTF-8 text",
                limit="unicode",
            ) from None
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2  # digits, without str() (it refuses huge ints)
    return _SCALAR_BYTES


def check_arguments(arguments: Any, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> None:
    """Refuse arguments nested deeper than `max_depth` or larger than about `max_bytes` as JSON.

    Raises:
        SandboxError: INVALID_ARGUMENTS naming the limit that was crossed.
    """
    total = 0
    stack: list[tuple[Any, int]] = [(arguments, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list | tuple):
            if depth + 1 > max_depth:
                raise SandboxError(
                    ErrorCode.INVALID_ARGUMENTS,
                    f"arguments are nested deeper than {max_depth} levels; send a flatter structure",
                    limit="max_depth",
                    max_depth=max_depth,
                )
            total += 2 + len(value)  # brackets and separators, counted before any item is queued
            if total <= max_bytes:
                if isinstance(value, dict):
                    for key, item in value.items():
                        total += _size(key) + 2
                        stack.append((item, depth + 1))
                else:
                    stack.extend((item, depth + 1) for item in value)
        else:
            total += _size(value)
        if total > max_bytes:
            raise SandboxError(
                ErrorCode.INVALID_ARGUMENTS,
                f"arguments are larger than {max_bytes:,} bytes as JSON; send less per call "
                "(write a large file in parts, or produce it with exec)",
                limit="max_bytes",
                max_bytes=max_bytes,
            )


def describe(arguments: Any) -> str:
    """A short, safe stand-in for refused arguments in the journal (never the arguments themselves)."""
    return f"<{type(arguments).__name__} refused before journaling: too deep or too large>"
