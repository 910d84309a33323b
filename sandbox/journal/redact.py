"""Masking secrets before anything is journaled: by key name and by value shape.

Only the secret characters are replaced; the text around them (a command, a URL, a config file)
stays readable, so a reviewer of the journal still sees what was run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sandbox.journal.redact_assignments import ASSIGN_COLON, ASSIGN_EQ, PAIR, mask_assignments, mask_named_literals
from sandbox.journal.redact_flags import (
    AWS_SET,
    CLIENT_NAMES,
    FLAG_VALUE,
    NETRC,
    OPENSSL_PASS,
    SQL_PASSWORD,
    USER_PASSWORD,
    mask_client_flags,
    mask_odbc_passwords,
    masked_flag,
    masked_secret_flag,
)
from sandbox.journal.redact_names import MASK, NAME_NEEDLES, has, secret_key, secret_name

__all__ = ["MASK", "MAX_TEXT", "READ_MARGIN", "redact", "redact_text", "redact_text_unfiltered", "secret_key"]
MAX_TEXT = 2000
# a shortened text is read this far past what it keeps: a secret across the cut (a quoted key of
# up to this length) is masked whole
READ_MARGIN = 64 * 1024

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
    (("hvs.", "hvb."), re.compile(r"\bhv[sb]\.[A-Za-z0-9_-]{20,}")),  # HashiCorp Vault
    (("pypi-AgE",), re.compile(r"\bpypi-AgE[A-Za-z0-9_-]{16,}")),  # PyPI API token
    (("npm_",), re.compile(r"\bnpm_[A-Za-z0-9]{36}\b")),  # npm access token
    (("hf_",), re.compile(r"\bhf_[A-Za-z0-9]{34,}")),  # Hugging Face
    (("SG.",), re.compile(r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}")),  # SendGrid
    (("_v1_",), re.compile(r"\bdo[por]_v1_[a-f0-9]{64}")),  # DigitalOcean
    # JWT: a header of at most 512 characters (`eyJ-eyJ-...` read to its end from every `eyJ`
    # was quadratic)
    (("eyJ",), re.compile(r"\beyJ[A-Za-z0-9_-]{8,512}+\.eyJ[A-Za-z0-9_-]{4,}+\.[A-Za-z0-9_-]{8,}")),
]


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
    (lambda _, folded: "dent" in folded or "pass" in folded, lambda text: SQL_PASSWORD.sub(masked_flag, text)),
    (lambda text, _: "configure" in text, lambda text: AWS_SET.sub(masked_flag, text)),
    (lambda text, _: "machine" in text, lambda text: NETRC.sub(masked_flag, text)),
    (lambda _, folded: "pwd" in folded, mask_odbc_passwords),
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
        lambda text, folded: "value" in folded and has(folded, NAME_NEEDLES),
        lambda text: mask_assignments(PAIR, text),
    ),
    (
        lambda text, folded: ("</" in text or "(" in text) and has(folded, NAME_NEEDLES),
        mask_named_literals,
    ),
    (
        lambda text, folded: "=" in text and has(folded, NAME_NEEDLES),
        lambda text: mask_assignments(ASSIGN_EQ, text),
    ),
    (
        lambda text, folded: ":" in text and has(folded, NAME_NEEDLES),
        lambda text: mask_assignments(ASSIGN_COLON, text),
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


# nesting deeper than this is not read: a hostile argument of `[[[[...]]]]` must not exhaust the
# stack (each level is two frames) where json.dumps would have written it
MAX_DEPTH = 64


def redact(value: Any, *, key: str = "", max_text: int | None = MAX_TEXT, _depth: int = 0) -> Any:
    """A copy of `value` with secrets masked and (unless `max_text` is None) long text shortened.
    A value under a secret's key is masked whole (a list of them too), a `{"name": "DB_PASSWORD",
    "value": ...}` pair's value as well."""
    if _depth > MAX_DEPTH:
        return f"[nested deeper than {MAX_DEPTH} levels]"
    if key and secret_key(key):
        return _masked_under_key(value, _depth)
    if isinstance(value, dict):
        masked = {k: redact(v, key=str(k), max_text=max_text, _depth=_depth + 1) for k, v in value.items()}
        pair = _secret_pair(value)
        if pair is not None:
            masked[pair] = _masked_under_key(value[pair], _depth)
        return masked
    if isinstance(value, list | tuple):
        return [redact(v, max_text=max_text, _depth=_depth + 1) for v in value]
    if isinstance(value, str):
        if max_text is not None and len(value) > max_text + READ_MARGIN:
            # only what is kept is read (a megabyte of arguments, journaled twice per call, was
            # read whole on the event loop); the last READ_MARGIN characters read are never kept:
            # a secret cut where the reading stopped is dropped, never half-shown
            read = value[: max_text + READ_MARGIN]
            text = redact_text(read)
            # a mask is longer than a one-character value: each moves the text's end up to 2 on
            inserted = max(0, text.count(MASK) - read.count(MASK))
            kept = max(0, min(max_text, len(text) - READ_MARGIN - 4 * inserted))
            return text[:kept] + f"... [{len(value) - kept} more characters]"
        text = redact_text(value)
        if max_text is not None and len(text) > max_text:
            text = text[:max_text] + f"... [{len(text) - max_text} more characters]"
        return text
    return value


def _masked_under_key(value: Any, depth: int) -> Any:
    """A secret key's value: a scalar masked, a list's scalars too (`{"passwords": [...]}`), a
    mapping's values each (`{"password": {"value": ...}}`); booleans and nulls say nothing."""
    if depth > MAX_DEPTH:
        return f"[nested deeper than {MAX_DEPTH} levels]"
    if isinstance(value, dict):
        return {k: _masked_under_key(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked_under_key(v, depth + 1) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    return MASK


def _secret_pair(value: dict[Any, Any]) -> Any:
    """The value key of `{"name": "DB_PASSWORD", "value": ...}` (an env list's entry, a header
    pair, SSM's `{"Name": ..., "Value": ...}`), or None."""
    if len(value) > 64:
        return None
    keys = {str(k).casefold(): k for k in value}
    name = value.get(keys.get("name", keys.get("key")))
    found = keys.get("value")
    return found if found is not None and isinstance(name, str) and len(name) <= 256 and secret_name(name) else None
