"""The proxy's search for a secret's value in a response, as attacks (pure, fast).

`images/egress/egress_scrub.py` runs inside the proxy (loaded here by path, as egress_rules is).
A server that knows the value tries to hand it to the sandbox whole, in part, or encoded at any
alignment and in any case; every such response must be found. Text that shares nothing with the
value must not be (a false alarm refuses a good response).
"""

from __future__ import annotations

import base64
import importlib.util
import sys
import textwrap
import urllib.parse
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.property_budget import examples

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("egress_scrub", ROOT / "images/egress/egress_scrub.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["egress_scrub"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


scrub = _load()
SETTINGS = settings(deadline=None, max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow])
VALUES = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=8, max_size=48)
CONTEXT = st.binary(max_size=64)


def _encodings(raw: bytes) -> dict[str, bytes]:
    b64 = base64.b64encode(raw)
    return {
        "raw": raw,
        "base64": b64,
        "base64 unpadded": b64.rstrip(b"="),
        "base64url": base64.urlsafe_b64encode(raw),
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
        "percent": urllib.parse.quote_from_bytes(raw, safe="").encode(),
        "percent twice": urllib.parse.quote(urllib.parse.quote_from_bytes(raw, safe=""), safe="").encode(),
        "mime base64": "\r\n".join(textwrap.wrap(b64.decode(), 76)).encode(),
    }


@pytest.mark.slow
@SETTINGS
@given(VALUES, CONTEXT, CONTEXT, st.sampled_from(sorted(_encodings(b"x"))))
def test_the_value_inside_anything_in_any_encoding_is_found(value: str, before: bytes, after: bytes, how: str) -> None:
    """The value embedded in other bytes (so base64 starts at any of its three alignments), then
    encoded whole: found."""
    encoded = _encodings(before + value.encode() + after)[how]
    assert scrub.leak(scrub.forms(value), b"HTTP body: " + encoded + b" end") is not None, how


@pytest.mark.slow
@SETTINGS
@given(VALUES, st.data(), st.sampled_from(["raw", "base64", "base64url", "hex", "HEX", "percent"]))
def test_eight_bytes_in_a_row_of_the_value_are_found(value: str, data: st.DataObject, how: str) -> None:
    """A run of 8 consecutive bytes of the value, cut anywhere, in any encoding: found."""
    raw = value.encode()
    start = data.draw(st.integers(0, len(raw) - 8))
    length = data.draw(st.integers(8, len(raw) - start))
    before = data.draw(CONTEXT)
    part = _encodings(before + raw[start : start + length])[how]
    assert scrub.leak(scrub.forms(value), part) is not None, (how, start, length)


@pytest.mark.slow
@SETTINGS
@given(st.text("abcdefghijklmnop", min_size=8, max_size=40), st.text("qrstuvwxyz0123 \n", max_size=400))
def test_text_sharing_nothing_with_the_value_is_not_flagged(value: str, other: str) -> None:
    """No false alarm on text drawn from another alphabet (and on the placeholder)."""
    haystack = ("sbx-secret-api-token-0f3e" + other).encode()
    assume(not any(c in other for c in value))
    assert scrub.leak(scrub.forms(value), haystack) is None


def test_seven_bytes_of_a_long_value_pass() -> None:
    """Fewer than 8 bytes in a row are not a leak (a 24-character token shares short runs by chance)."""
    value = "s3cr3t-value-0123456789"
    assert scrub.leak(scrub.forms(value), b"xx s3cr3t- yy 0123456 zz") is None
    assert scrub.leak(scrub.forms(value), b"xx s3cr3t-v yy") is not None


def test_a_short_value_is_found_whole_only() -> None:
    """A value shorter than 8 counts as a run only whole."""
    value = "abc12"
    assert scrub.leak(scrub.forms(value), b"...abc12...") is not None
    assert scrub.leak(scrub.forms(value), b"...abc1...") is None


@pytest.mark.slow
def test_too_many_anchor_hits_fails_closed() -> None:
    """A body built to make the search slow raises (the proxy then refuses the response)."""
    value = "aaaaZqqqYwww"  # its first chunk occurs everywhere in the body, its windows nowhere
    try:
        scrub.leak(scrub.forms(value), b"a" * (scrub.MAX_HITS * 3))
    except scrub.TooManyHits:
        return
    raise AssertionError("expected TooManyHits")
