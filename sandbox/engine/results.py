"""Shaping a handler's output for the model: cut long text with an explicit marker, keep it all on disk."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TEXT_FIELDS = ("output", "stdout", "stderr", "content")


@dataclass(frozen=True)
class Shaped:
    """The output as the model gets it, and the full text when something was cut."""

    output: Any
    truncated: bool
    full_text: str | None


def cut(text: str, max_chars: int, where: str | None) -> str:
    """Keep the head and the tail of `text`; say how much was cut and where the rest is."""
    if len(text) <= max_chars:
        return text
    head = int(max_chars * 0.6)
    tail = max_chars - head
    removed = len(text) - head - tail
    place = f"; full output in {where}" if where else ""
    marker = f"\n\n[... truncated: {removed:,} of {len(text):,} characters cut{place} ...]\n\n"
    return text[:head] + marker + text[-tail:]


def shape(output: Any, max_chars: int, spill_path: str | None) -> Shaped:
    """Cut every long text field of `output` (a string or a dict of fields)."""
    if isinstance(output, str):
        if len(output) <= max_chars:
            return Shaped(output, False, None)
        return Shaped(cut(output, max_chars, spill_path), True, output)
    if isinstance(output, dict):
        long_fields = [k for k in TEXT_FIELDS if isinstance(output.get(k), str) and len(output[k]) > max_chars]
        if not long_fields:
            return Shaped(output, False, None)
        full = "\n".join(f"===== {k} =====\n{output[k]}" if len(long_fields) > 1 else output[k] for k in long_fields)
        shaped = dict(output)
        for k in long_fields:
            shaped[k] = cut(output[k], max_chars, spill_path)
        return Shaped(shaped, True, full)
    return Shaped(output, False, None)
