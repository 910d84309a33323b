"""Making text chosen by a model or a sandbox safe to show to an operator (a terminal, or the console's pages).

Tool names, arguments, paths and outputs come from the model or from inside the sandbox. Printed
raw, an ESC, OSC, BEL, backspace, CR, C1 control or bidi override would replay on the terminal
(retitle it, clear it, hide or reorder text). Every human-readable line the CLI prints goes
through :func:`escape` (or :func:`escape_json` for JSON), so such characters show as visible
`\\x1b` / `\\u202e` escapes instead of acting.
"""

from __future__ import annotations

import json
from typing import Any

MULTILINE_KEEP = frozenset("\n\t")


def is_unsafe(ch: str) -> bool:
    """Whether a character may act on a terminal (or hide as blank) instead of being shown.

    `str.isprintable` is False for controls (Cc), format characters (Cf: bidi overrides, zero
    widths, tags), separators other than the space, surrogates, private-use and unassigned code
    points: stricter than needed, and one C-speed test.
    """
    return not ch.isprintable()


def _visible(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(text: str, *, multiline: bool = False) -> str:
    """`text` with every control and format character replaced by a visible escape.

    Args:
        text: anything a model or a sandbox may have chosen.
        multiline: keep newlines and tabs (for output blocks); otherwise they are escaped too,
            so one value can never forge a second line.

    Returns:
        Text with no character that a terminal would act on.
    """

    if text.isprintable():
        return text
    keep = MULTILINE_KEEP if multiline else frozenset()
    return "".join(ch if ch.isprintable() or ch in keep else _visible(ch) for ch in text)


def escape_json(data: Any, *, indent: int | None = None) -> str:
    """JSON of `data` that keeps readable Unicode but escapes every control and format character.

    `json.dumps` already escapes C0 controls; C1 controls, bidi overrides and separators would
    pass through raw. They can only occur inside string literals, so `\\uXXXX` is valid there.
    """
    text = json.dumps(data, indent=indent, ensure_ascii=False, default=str)
    if text.isprintable():
        return text
    # outside strings json.dumps writes only spaces and (with indent) newlines
    return "".join(ch if ch.isprintable() or ch == "\n" else json.dumps(ch)[1:-1] for ch in text)


def escape_json_cut(data: Any, limit: int, *, indent: int | None = None) -> tuple[str, int]:
    """The first `limit` characters of `data`'s JSON, escaped as :func:`escape_json` does, and how
    many characters were left out: only what is shown is escaped (a tenant's megabytes cost one
    `json.dumps`, never a character-by-character pass)."""
    text = json.dumps(data, indent=indent, ensure_ascii=False, default=str)
    shown = text[:limit]
    if not shown.isprintable():
        shown = "".join(ch if ch.isprintable() or ch == "\n" else json.dumps(ch)[1:-1] for ch in shown)
    return shown, max(0, len(text) - limit)


def cut_marked(text: str, limit: int) -> str:
    """At most `limit` characters of `text`, and when cut, say how much: `… (+1,234 chars)`."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit:,} chars)"
