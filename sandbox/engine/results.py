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


WORD_SLACK = 200  # how far a cut moves to fall between two words


def cut(text: str, max_chars: int, where: str | None) -> str:
    """Keep the head and the tail of `text`; say how much was cut and where the rest is.

    Each cut falls between two words when a space is near (within WORD_SLACK characters): a
    token cut in half (the end of a key, say) matches no secret pattern, so the journal's
    masking would let its half through; whole, it is masked, or it is not there at all.
    """
    if len(text) <= max_chars:
        return text
    head = int(max_chars * 0.6)
    tail_start = len(text) - (max_chars - head)
    if _inside_a_word(text, head):
        space = max(text.rfind(c, max(0, head - WORD_SLACK), head) for c in " \n\t")
        head = space + 1 if space >= 0 else head
    if _inside_a_word(text, tail_start):
        found = [i for i in (text.find(c, tail_start, tail_start + WORD_SLACK) for c in " \n\t") if i >= 0]
        tail_start = min(found) if found else tail_start
    removed = tail_start - head
    place = f"; full output in {where}" if where else ""
    marker = f"\n\n[... truncated: {removed:,} of {len(text):,} characters cut{place} ...]\n\n"
    return text[:head] + marker + text[tail_start:]


def _inside_a_word(text: str, at: int) -> bool:
    """Whether a cut at `at` would split a run of non-space characters."""
    return 0 < at < len(text) and not text[at - 1].isspace() and not text[at].isspace()


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
