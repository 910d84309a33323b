"""Masking secrets before anything is journaled: by key name and by value shape.

Only the secret characters are replaced; the text around them (a command, a URL, a config file)
stays readable, so a reviewer of the journal still sees what was run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sandbox.journal.redact_flags import (
    CLIENT_NAMES,
    FLAG_VALUE,
    OPENSSL_PASS,
    USER_PASSWORD,
    mask_client_flags,
    masked_flag,
    masked_secret_flag,
)
from sandbox.journal.redact_names import MASK, NAME_NEEDLES, REFERENCE, has, secret_key, secret_name

__all__ = ["MASK", "MAX_TEXT", "READ_MARGIN", "redact", "redact_text", "redact_text_unfiltered", "secret_key"]
MAX_TEXT = 2000
# a shortened text is read this far past what it keeps: a secret across the cut (a quoted key of
# up to this length) is masked whole
READ_MARGIN = 64 * 1024

# A name is one whole word, taken possessively (never given back: each text is read in linear
# time whatever it holds, `KEY-KEY-KEY-...` included), starting at a word's start (never inside
# a hyphenated one); whether it is secret is decided on its segments (_secret_name).
_WORD = r"(?<![A-Za-z0-9_])(?<![A-Za-z0-9]-)(?P<name>[A-Za-z0-9]++(?:[_-][A-Za-z0-9]++)*+)"
# a value, read only after a secret's name and separator (_mask_assignments): quoted to the end
# of its line (the other quote allowed inside: `"it's"`), or bare (a run of these characters,
# not starting with `=`)
_QUOTED = {q: re.compile(rf"{q}(?P<quoted>[^{q}\n]*+){q}") for q in ("'", '"')}
_BARE_RUN = re.compile(r"""[^\s;&|'"`<>()]*+""")
# NAME= anywhere (shell, URLs, flags, .env files), and a subscript's `['NAME'] =` (os.environ)
_ASSIGN_EQ = re.compile(rf"""{_WORD}(?P<sep>(?:["']\])?[ \t]*=[ \t]*)""", re.I)
# NAME: only where it is a key (line start: YAML, headers) or quoted (JSON); elsewhere a colon is
# ordinary text (`echo PASS: done`)
_ASSIGN_COLON = re.compile(rf"""(?P<lead>^[ \t-]*+["']?|["']){_WORD}(?P<sep>["']?[ \t]*:[ \t]*)""", re.I | re.M)
# found from its `://` (a scheme read from every word start of `a.a.a...` was quadratic)
_URL_PASSWORD = re.compile(r"(?P<pre>://[^\s:/@]*+:)(?P<pw>[^\s@/]+)(?=@)")
# `Authorization:` with a scheme or none (a bare token), also as a quoted key (JSON, a Python
# dict), and `Bearer <token>` anywhere; a Digest header's parameters up to the quote that ends the
# header (a `'`, or a `"` before a blank) or the line's end
_AUTHORIZATION = r"""\b(?:proxy-)?authorization["']?[ \t]*+:[ \t]*+["']?"""
_BEARER = re.compile(
    rf"(?P<pre>(?:{_AUTHORIZATION}(?:(?:bearer|basic|token|negotiate|ntlm)[ \t]+)?|\bbearer[ \t]+))"
    r"(?P<tok>[A-Za-z0-9._~+/=-]{12,})",
    re.I,
)
_DIGEST = re.compile(rf"""(?P<pre>{_AUTHORIZATION}digest[ \t]++)(?P<tok>(?:[^\r\n'"\\]|\\.|"(?![\s]|\Z))++)""", re.I)
# a cookie header's whole value (session ids)
_COOKIE = re.compile(r"""(?P<pre>\b(?:set-)?cookie:[ \t]*+)(?P<val>[^\r\n"']+)""", re.I)
_PEM_BEGIN = re.compile(r"-----BEGIN (?P<kind>[A-Z0-9 ]*)PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
# a key body: base64 lines, RFC 1421 headers (Proc-Type, DEK-Info), escaped or real newlines
_PEM_BODY = re.compile(r"(?:[A-Za-z0-9+/=\s]|\\n|\\r|(?<=\n)[A-Za-z-]+: [^\n]*\n)*")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/=]{16,}")

# Whole-token shapes of well-known credentials (the token itself is the secret), each with the
# literal texts one of which every match contains: a pattern runs only on text that holds one
# (a `str.find` is a memchr, a regex starting with \b tries every position: 20x the cost).
SECRET_VALUES: list[tuple[tuple[str, ...], re.Pattern[str]]] = [
    (("AKIA", "ASIA", "AGPA", "AIDA", "AROA"), re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b")),  # AWS
    (("_live_", "_test_"), re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{8,}")),  # Stripe
    (("whsec_",), re.compile(r"\bwhsec_[A-Za-z0-9]{16,}")),  # Stripe webhook secret
    (("sk-",), re.compile(r"\bsk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_-]{16,}")),  # OpenAI / Anthropic
    (("gh", "github_pat_"), re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),  # GitHub
    (("glpat-",), re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),  # GitLab
    (("xox", "xapp-"), re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}|\bxapp-[A-Za-z0-9-]{10,}")),  # Slack
    (("AIza",), re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),  # Google API key
    # JWT: a header of at most 512 characters (`eyJ-eyJ-...` read to its end from every `eyJ`
    # was quadratic)
    (("eyJ",), re.compile(r"\beyJ[A-Za-z0-9_-]{8,512}+\.eyJ[A-Za-z0-9_-]{4,}+\.[A-Za-z0-9_-]{8,}")),
]


def _mask_assignments(pattern: re.Pattern[str], text: str) -> str:
    """Every value after a secret's `name<sep>` of `pattern` in `text`, masked. The search goes
    on right after each separator, so a value is read only after a secret's name, and text is
    read a bounded number of times whatever it holds (`FOO=API_KEY=x`, `x=a=a=a...`)."""
    out: list[str] = []
    done = 0
    run = _Run()
    for m in pattern.finditer(text):  # name and separator only: one reading of the text, in C
        pos = m.end()
        if m.start() < done or not secret_name(m.group("name")):  # inside a masked value, or not a secret
            continue
        # a YAML key or a header: the first thing on its line (at most one such name a line)
        keyed = pattern is _ASSIGN_COLON and (m.start() == 0 or text[m.start() - 1] == "\n")
        quote = text[pos : pos + 1]
        if quote in _QUOTED:
            value = _QUOTED[quote].match(text, pos)
            if value is None or not value.group("quoted") or REFERENCE.fullmatch(value.group("quoted")):
                continue
            end, masked = value.end(), f"{quote}{MASK}{quote}"
        elif keyed and (below := _value_below(text, pos, m.start("name") - m.start())) is not None:
            pos, end = below  # `password:` with its value on the lines under it
            masked = MASK
        else:
            # a key's value is the rest of its line (YAML's `passphrase: correct horse battery`),
            # less a comment; elsewhere the run of value characters
            end = _line_value_end(text, pos) if keyed else run.end_from(text, pos)
            # `$VAR` and `$(cmd)` are not secrets but references to one: left visible, and read
            # on (`TOKEN=$X,PASSWORD=y`); a value that only holds one further on (`S$x`) is
            # masked. `Authorization: Bearer ***`: the scheme stays, its token is masked apart
            if end == pos or text[pos] in ("=$`#" if keyed else "=$`") or _scheme_first(text, pos, end):
                continue
            masked = MASK
        out += (text[done:pos], masked)
        done = end
    out.append(text[done:])
    return "".join(out)


# HTTP authorization schemes, whose tokens _BEARER and _DIGEST mask
_SCHEMES = frozenset({"bearer", "basic", "token", "digest", "negotiate", "ntlm"})
_FIRST_WORD = re.compile(r"[A-Za-z]{1,9}+(?![A-Za-z])")


def _scheme_first(text: str, pos: int, end: int) -> bool:
    word = _FIRST_WORD.match(text, pos, end)
    return word is not None and word.group(0).casefold() in _SCHEMES


def _line_value_end(text: str, pos: int) -> int:
    """Where a key's value on its own line ends: before a ` #` comment, trailing blanks or `\r`."""
    line_end = text.find("\n", pos)
    line_end = len(text) if line_end < 0 else line_end
    comment = text.find(" #", pos, line_end)
    end = line_end if comment < 0 else comment
    while end > pos and text[end - 1] in " \t\r":
        end -= 1
    return end


# what may follow a YAML key whose value is on the lines under it: a block scalar's indicator
# (`|`, `>-`, `|2+`), a comment, then the line's end
_BELOW_HEADER = re.compile(r"(?:[|>][-+0-9]{0,3})?[ \t]*+(?:#[^\n]*+)?\r?\n")
_INDENT = re.compile(r"[ \t]*+")
# a line that is a mapping's key: the key's value is a mapping, whose own keys are judged each
_KEY_LINE = re.compile(r"""["']?[^\s:'"#-][^\s:'"]*+["']?[ \t]*+:(?=[ \t\r\n]|\Z)""")


def _value_below(text: str, pos: int, column: int) -> tuple[int, int] | None:
    """A YAML value under its key at `column` (`password:` then the line's end, or `password:
    |`): where the lines more indented than the key (or a list at its indentation) begin and
    end; None when no such line follows, or the first is a key of its own. The key is the first
    thing on its line, so each line is read once: the lines taken are past the next name."""
    header = _BELOW_HEADER.match(text, pos)
    if header is None:
        return None
    start = end = -1
    line = header.end()
    while line < len(text):
        indent = _INDENT.match(text, line)
        first = indent.end() if indent is not None else line
        line_end = text.find("\n", line)
        line_end = len(text) if line_end < 0 else line_end
        if first < line_end and text[first] != "\r":  # a blank line neither ends nor starts the value
            depth = first - line
            if depth < column or (depth == column and text[first] != "-"):
                break
            if start < 0:
                if _KEY_LINE.match(text, first):
                    return None
                start = first
            end = line_end
        line = line_end + 1
    return (start, end) if start >= 0 else None


class _Run:
    """The bare value a position starts, found once per run of value characters: a bare value
    ends at the same place from any start inside its run."""

    def __init__(self) -> None:
        self.start = self.end = -1

    def end_from(self, text: str, pos: int) -> int:
        if not self.start <= pos < self.end:
            found = _BARE_RUN.match(text, pos)
            self.start, self.end = pos, found.end() if found else pos
        return self.end


def _mask_pem(text: str) -> str:
    out: list[str] = []
    pos = 0
    while (begin := _PEM_BEGIN.search(text, pos)) is not None:
        body_start = begin.end()
        end = _PEM_END.search(text, body_start)
        body_end = end.start() if end else len(text)
        body = text[body_start:body_end]
        out.append(text[pos:body_start])
        if _PEM_BODY.fullmatch(body):
            out.append(f"\n{MASK}\n" if body.strip() else body)
        else:
            # the markers wrap something that is not key material (shell code?): mask only the
            # long base64 runs that look random (mixed case and digits), keep the rest readable
            out.append(_BASE64_RUN.sub(_mask_random_run, body))
        pos = body_end
    out.append(text[pos:])
    return "".join(out)


def _mask_random_run(m: re.Match[str]) -> str:
    run = m.group(0)
    looks_random = any(c.isupper() for c in run) and any(c.islower() for c in run) and any(c.isdigit() for c in run)
    return MASK if looks_random else run


Guard = Callable[[str, str], bool]  # (the text now, the original text case-folded) -> can it match?
Step = Callable[[str], str]


def _token_step(needles: tuple[str, ...], pattern: re.Pattern[str]) -> tuple[Guard, Step]:
    return (lambda text, _folded: has(text, needles)), (lambda text: pattern.sub(MASK, text))


# Key blocks first (their body must not be cut by the token shapes), assignments last. Each step
# has a guard: a literal every one of its matches needs (masking adds no letters, so the original
# text's case-folded form still answers for the name patterns; `casefold`, not `lower`, since
# re.IGNORECASE matches `ſ` with `s`).
_STEPS: list[tuple[Guard, Step]] = [
    (lambda text, _: "-----BEGIN " in text, _mask_pem),
    (lambda text, _: "://" in text, lambda text: _URL_PASSWORD.sub(lambda m: m.group("pre") + MASK, text)),
    (
        lambda _, folded: "bearer" in folded or "author" in folded,
        lambda text: _BEARER.sub(lambda m: m.group("pre") + MASK, text),
    ),
    (lambda _, folded: "author" in folded, lambda text: _DIGEST.sub(lambda m: m.group("pre") + MASK, text)),
    (lambda text, _: has(text, CLIENT_NAMES), mask_client_flags),
    (lambda text, _: "pass:" in text, lambda text: OPENSSL_PASS.sub(masked_flag, text)),
    # "cook": re.IGNORECASE matches `ı` and `İ` with `i`, which case folding keeps apart
    (lambda _, folded: "cook" in folded, lambda text: _COOKIE.sub(lambda m: m.group("pre") + MASK, text)),
    (
        lambda text, folded: "-" in text and has(folded, NAME_NEEDLES),
        lambda text: FLAG_VALUE.sub(masked_secret_flag, text),
    ),
    (
        lambda text, _: "-u" in text or "--user" in text,
        lambda text: USER_PASSWORD.sub(lambda m: m.group("pre") + MASK, text),
    ),
    *(_token_step(needles, pattern) for needles, pattern in SECRET_VALUES),
    (
        lambda text, folded: "=" in text and has(folded, NAME_NEEDLES),
        lambda text: _mask_assignments(_ASSIGN_EQ, text),
    ),
    (
        lambda text, folded: ":" in text and has(folded, NAME_NEEDLES),
        lambda text: _mask_assignments(_ASSIGN_COLON, text),
    ),
]


def redact_text(text: str) -> str:
    """`text` with every secret shape masked (key blocks, URL passwords, tokens, assignments).

    A step runs only when its guard says it can match: the result is the same as running them
    all (:func:`redact_text_unfiltered`; tests/test_redact_prefilter.py checks it)."""
    folded = text.casefold()
    for can_match, step in _STEPS:
        if can_match(text, folded):
            text = step(text)
    return text


def redact_text_unfiltered(text: str) -> str:
    """Every step on the whole text, no guard: what :func:`redact_text` must equal."""
    for _, step in _STEPS:
        text = step(text)
    return text


def redact(value: Any, *, key: str = "", max_text: int | None = MAX_TEXT) -> Any:
    """A copy of `value` with secrets masked and (unless `max_text` is None) long text shortened."""
    if secret_key(key) and not isinstance(value, dict | list | bool) and value is not None:
        return MASK
    if isinstance(value, dict):
        return {k: redact(v, key=str(k), max_text=max_text) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, max_text=max_text) for v in value]
    if isinstance(value, str):
        if max_text is not None and len(value) > max_text + READ_MARGIN:
            # only what is kept is read (a megabyte of arguments, journaled twice per call, was
            # read whole on the event loop); the last READ_MARGIN characters read are never kept:
            # a secret cut where the reading stopped is dropped, never half-shown
            text = redact_text(value[: max_text + READ_MARGIN])
            # a mask is longer than a one-character value: each moves the text's end up to 2 on
            kept = max(0, min(max_text, len(text) - READ_MARGIN - 4 * text.count(MASK)))
            return text[:kept] + f"... [{len(value) - kept} more characters]"
        text = redact_text(value)
        if max_text is not None and len(text) > max_text:
            text = text[:max_text] + f"... [{len(text) - max_text} more characters]"
        return text
    return value
