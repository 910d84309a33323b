"""Whether bytes carry a secret's value, whole, in part or encoded (pure; standard library only).

A response from a secret's host must not hand the sandbox the value: not whole, not a run of
RUN (8) or more of its consecutive characters, and not such a run in base64 (at any of the three
alignments, with or without padding), base64url, hex (either case) or percent-encoding (also
doubly encoded). The whole value, as written, is turned back into the placeholder by the caller;
anything else found here refuses the response.

Searching is anchored: every window of a form contains one of its aligned chunks of half the
window's length, so the haystack is scanned with `bytes.find` per chunk (C speed), and only the
few places a chunk occurs are compared against the windows.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from dataclasses import dataclass

RUN = 8  # consecutive characters of the value that count as a leak
MAX_HITS = 100_000  # chunk hits to verify before giving up (the caller then refuses: fail closed)
_SPACE = re.compile(rb"\s+")


class TooManyHits(Exception):
    """The haystack matched so many anchors that checking it would take too long."""


def _windows(form: bytes, width: int) -> frozenset[bytes]:
    if len(form) <= width:
        return frozenset([form]) if form else frozenset()
    return frozenset(form[i : i + width] for i in range(len(form) - width + 1))


def _b64_cores(raw: bytes) -> list[bytes]:
    """The base64 characters that depend on `raw` alone, for each of the 3 alignments it can have."""
    cores = []
    for lead in range(3):
        data = bytes(lead) + raw
        encoded = base64.b64encode(data)
        full, rest = divmod(len(data), 3)
        skip = (0, 2, 3)[lead]  # characters that carry bits of the bytes before the value
        cores.append(encoded[skip : full * 4 + rest])
    return cores


def _b64_width(run: int) -> int:
    """The fewest characters a run of `run` bytes fully determines in base64, over the alignments."""
    return min(len(core) for core in _b64_cores(bytes(run))) if run else 0


@dataclass(frozen=True)
class Form:
    """One way the value may be written: the windows that betray it, and their anchor chunks."""

    name: str
    windows: frozenset[bytes]
    width: int
    chunks: tuple[bytes, ...]


def _form(name: str, sources: list[bytes], width: int) -> Form:
    windows: set[bytes] = set()
    chunks: set[bytes] = set()
    step = max(1, width // 2)
    for source in sources:
        windows |= _windows(source, width)
        if len(source) <= width:
            chunks.add(source)
        else:
            chunks.update(source[i : i + step] for i in range(0, len(source) - step + 1, step))
    return Form(name, frozenset(windows), width, tuple(sorted(c for c in chunks if c)))


def forms(value: str) -> list[Form]:
    """Every form of `value` a response is checked for."""
    raw = value.encode("utf-8")
    run = min(RUN, len(raw))
    cores = _b64_cores(raw)
    width = max(1, _b64_width(run))
    return [
        _form("part of the value", [raw], run),
        _form("the value in hex", [raw.hex().encode(), raw.hex().upper().encode()], 2 * run),
        _form("the value in base64", cores, width),
        _form("the value in base64url", [c.translate(bytes.maketrans(b"+/", b"-_")) for c in cores], width),
    ]


def _found(form: Form, haystack: bytes) -> bool:
    hits = 0
    for chunk in form.chunks:
        start = haystack.find(chunk)
        while start != -1:
            hits += 1
            if hits > MAX_HITS:
                raise TooManyHits(form.name)
            region = haystack[max(0, start - form.width) : start + form.width + len(chunk)]
            if any(window in region for window in form.windows):
                return True
            start = haystack.find(chunk, start + 1)
    return False


def _unquoted(data: bytes) -> list[bytes]:
    """`data` percent-decoded once, twice and three times (each a new view), when it holds a %."""
    views = []
    current = data
    for _ in range(3):
        if b"%" not in current and b"+" not in current:
            break
        decoded = urllib.parse.unquote_to_bytes(current.replace(b"+", b" "))
        if decoded == current:
            break
        views.append(decoded)
        current = decoded
    return views


def leak(value_forms: list[Form], data: bytes) -> str | None:
    """Which form of the value `data` holds (None: none).

    Raises:
        TooManyHits: the check could not be finished (the caller refuses: fail closed).
    """
    if not data:
        return None
    compact = _SPACE.sub(b"", data)  # a line-wrapped base64 or hex dump
    for view, suffix in [(data, ""), (compact, " (split by white space)")]:
        for form in value_forms:
            if _found(form, view):
                return form.name + suffix
    for view in _unquoted(data):
        for form in value_forms:
            if _found(form, view):
                return form.name + " (percent-encoded)"
    return None
