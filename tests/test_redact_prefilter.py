"""The journal's redaction skips a pattern when the text lacks a literal every match needs
(journal/redact.py): the result must be exactly what running every pattern gives, for any text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.journal.redact import MASK, redact_text, redact_text_unfiltered

# the pieces secrets and their names are made of, and the look-alikes case folding must catch
FRAGMENTS = [
    "key",
    "KEY",
    "Key",
    "api_key",
    "APIKEY",
    "token",
    "ToKeN",
    "secret",
    "pass",
    "PASSWORD",
    "passwd",
    "credentials",
    "CREDENTıALS",
    "auth",
    "AUTH",
    "ſ",
    "ı",
    "İ",
    "\u212a",
    "=",
    ":",
    " ",
    "\t",
    '"',
    "'",
    "\n",
    "$",
    "`",
    "-",
    "_",
    "sk-",
    "sk-proj-",
    "sk_live_",
    "rk_test_",
    "whsec_",
    "AKIA",
    "ASIA",
    "ghp_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xapp-",
    "AIza",
    "eyJ",
    ".",
    "://",
    "user:",
    "@",
    "bearer ",
    "Authorization: ",
    "authorization:basic ",
    "-----BEGIN ",
    "RSA ",
    "PRIVATE KEY-----",
    "-----END ",
    "A1b2C3d4E5f6G7h8",
    "0123456789abcdef",
    "ABCDEFGHIJKLMNOP",
    "xyz",
    "/",
    "+",
]

texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=40).map("".join)


@settings(max_examples=600, deadline=None)
@given(texts)
def test_the_prefilter_changes_nothing(text: str) -> None:
    assert redact_text(text) == redact_text_unfiltered(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_unicode_text_is_redacted_as_by_every_pattern(text: str) -> None:
    assert redact_text(text) == redact_text_unfiltered(text)


def test_look_alike_letters_still_reach_the_assignment_patterns() -> None:
    # re.IGNORECASE matches `ſ` with `s` and `ı` with `i`: the filter must not skip these
    for text in ("PAſſWORD=hunter2hunter2", "CREDENTıAL=hunter2hunter2", "\u212aEY=hunter2hunter2"):
        assert redact_text(text) == redact_text_unfiltered(text)
        assert MASK in redact_text(text), text


def test_plain_text_without_any_needle_is_returned_as_is() -> None:
    text = "x" * 4095 + "\n"
    assert redact_text(text) == text
