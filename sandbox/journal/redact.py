"""Masking secrets before anything is journaled: by key name and by value shape.

Only the secret characters are replaced; the text around them (a command, a URL, a config file)
stays readable, so a reviewer of the journal still sees what was run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

MASK = "***"
MAX_TEXT = 2000
# a shortened text is read this far past what it keeps: a secret across the cut (a quoted key of
# up to this length) is masked whole
READ_MARGIN = 64 * 1024

# Dict keys whose scalar values are secrets ({"env": {"API_TOKEN": ...}}, {"password": ...}).
SECRET_KEYS = re.compile(
    r"(pass(word|wd|phrase)?|secret|token|api[_-]?key|(^|[_-])key$|auth|credential|private[_-]?key|cookie)", re.I
)

# Words that make a variable name secret when they are one of its `_`- or `-`-separated segments:
# API_TOKEN, FOO_SECRET, AWS_SECRET_ACCESS_KEY, X-Api-Key, password, and a password with a short
# prefix glued on (PGPASSWORD); never MONKEY, KEYBOARD or PWD. A segment is matched whole and
# case-insensitively, as the patterns are (`ſ`, `ı`, the Kelvin sign).
_SECRET_SEGMENT = re.compile(
    r"keys?|apikey|tokens?|secrets?|passwd|pass|passphrase|credentials?|auth|[a-z0-9]{0,16}password", re.I
)
# A name is one whole word, taken possessively (never given back: each text is read in linear
# time whatever it holds, `KEY-KEY-KEY-...` included), starting at a word's start (never inside
# a hyphenated one); whether it is secret is decided on its segments (_secret_name).
_WORD = r"(?<![A-Za-z0-9_])(?<![A-Za-z0-9]-)(?P<name>[A-Za-z0-9]++(?:[_-][A-Za-z0-9]++)*+)"
# a value, read only after a secret's name and separator (_mask_assignments): quoted to the end
# of its line (the other quote allowed inside: `"it's"`), or bare (a run of these characters,
# not starting with `=`)
_QUOTED = {q: re.compile(rf"{q}(?P<quoted>[^{q}\n]*+){q}") for q in ("'", '"')}
_BARE_RUN = re.compile(r"""[^\s;&|'"`<>()]*+""")
# a value that only refers to a secret kept elsewhere: `$VAR`, `${VAR}`, `$(cmd)`, a backquoted command
_REFERENCE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*+|\{[^}\n]*+\}|\([^)\n]*+\))|`[^`\n]*+`")
# NAME= anywhere (shell, URLs, flags, .env files), and a subscript's `['NAME'] =` (os.environ)
_ASSIGN_EQ = re.compile(rf"""{_WORD}(?P<sep>(?:["']?\])?[ \t]*=[ \t]*)""", re.I)
# NAME: only where it is a key (line start: YAML, headers) or quoted (JSON); elsewhere a colon is
# ordinary text (`echo PASS: done`)
_ASSIGN_COLON = re.compile(rf"""(?P<lead>^[ \t-]*+["']?|["']){_WORD}(?P<sep>["']?[ \t]*:[ \t]*)""", re.I | re.M)
# found from its `://` (a scheme read from every word start of `a.a.a...` was quadratic)
_URL_PASSWORD = re.compile(r"(?P<pre>://[^\s:/@]*+:)(?P<pw>[^\s@/]+)(?=@)")
# `Authorization:` with a scheme or none (a bare token), also as a quoted key (JSON, a Python
# dict), and `Bearer <token>` anywhere; a Digest header's parameters to the line's end
_AUTHORIZATION = r"""\b(?:proxy-)?authorization["']?:[ \t]*+["']?"""
_BEARER = re.compile(
    rf"(?P<pre>(?:{_AUTHORIZATION}(?:(?:bearer|basic|token)[ \t]+)?|\bbearer[ \t]+))"
    r"(?P<tok>[A-Za-z0-9._~+/=-]{12,})",
    re.I,
)
_DIGEST = re.compile(rf"(?P<pre>{_AUTHORIZATION}digest[ \t]++)(?P<tok>[^\r\n']++)", re.I)
# a cookie header's whole value (session ids)
_COOKIE = re.compile(r"""(?P<pre>\b(?:set-)?cookie:[ \t]*+)(?P<val>[^\r\n"']+)""", re.I)
# a secret given as a command-line flag's next word: `--token VALUE`, `--password 'x y'`,
# `--secret-key VALUE`; not a `$VAR`, and not a redirection or a pipe (`--with-token < file`)
_FLAG_VALUE = re.compile(
    r"(?P<pre>(?<![A-Za-z0-9_-])--?(?:[A-Za-z0-9]++[-_])*?"
    r"(?:token|password|passwd|passphrase|pass|secret|credentials?|(?:api|secret|private|access)[-_]?key)[ \t]++)"
    r"(?P<val>\"[^\"\n]*+\"|'[^'\n]*+'|[^\s'\"$`<>|;&=-][^\s'\"]*+)",
    re.I,
)
# curl's and wget's credentials: `-u user:password`, `--user=user:password` (the password may
# hold `@`); after a space or a line's start only; a numeric password is a uid:gid (`docker -u 0:0`)
_USER_PASSWORD = re.compile(
    r"(?P<pre>(?:(?<=\s)|^)(?:-u|--user)[ \t=]*+['\"]?[^\s:'\"]{1,256}:)(?P<pw>(?![0-9]+(?:[\s'\"]|$))[^\s'\"]++)",
    re.M,
)
# Database and registry clients that take a password glued to or after a short flag, within one
# command (up to `;`, `&`, `|` or a line's end): `mysql -uroot -pS`, `sshpass -p S ssh host`,
# `docker login -u me -p S`, `redis-cli -a S`. The flag means something else in other commands
# (`mkdir -p`, `ssh -p 22`), so it is looked for only after the client's name. OpenSSL's
# `pass:S` (`-passin pass:S`) anywhere.
_COMMAND = re.compile(r"[^;&|\n]++")
_FLAG_SECRET = r"""(?P<val>'[^'\n]*+'|"[^"\n]*+"|[^\s'"]++)"""  # noqa: S105 - a pattern
_CLIENT_FLAGS: list[tuple[re.Pattern[str], re.Pattern[str], int]] = [  # (client, flag, how many: 0 all)
    (
        re.compile(r"(?<![\w./-])(?:mysql\w*+|mariadb[\w-]*+)(?![\w.-])"),
        re.compile(rf"(?<=\s)(?P<pre>-p){_FLAG_SECRET}"),
        0,
    ),
    (  # sshpass's own options only, before the command it runs (`sshpass -f pw ssh -p 22 h`)
        re.compile(r"(?<![\w./-])sshpass(?![\w.-])"),
        re.compile(rf"\A(?P<pre>(?:[ \t]++-(?:[fdP][ \t]*+[^\s-]\S*+|[evhV]))*+[ \t]++-p[ \t]*+){_FLAG_SECRET}"),
        1,
    ),
    (re.compile(r"(?<![\w./-])login(?![\w.-])"), re.compile(rf"(?<=\s)(?P<pre>-p[ \t]++){_FLAG_SECRET}"), 1),
    (re.compile(r"(?<![\w./-])redis-cli(?![\w.-])"), re.compile(rf"(?<=\s)(?P<pre>-a[ \t]++){_FLAG_SECRET}"), 1),
]
_CLIENT_NAMES = ("mysql", "mariadb", "sshpass", "login", "redis-cli")
_OPENSSL_PASS = re.compile(rf"(?<![\w-])(?P<pre>pass:){_FLAG_SECRET}")


def _mask_client_flags(text: str) -> str:
    """The password flags of _CLIENT_FLAGS, each command read once per client."""

    def one(command: re.Match[str]) -> str:
        part = command.group(0)
        for client, flag, count in _CLIENT_FLAGS:
            named = client.search(part)
            if named is not None:
                rest = flag.sub(_masked_flag, part[named.end() :], count=count)
                part = part[: named.end()] + rest
        return part

    return _COMMAND.sub(one, text)


def _masked_flag(m: re.Match[str]) -> str:
    """A flag's value masked, unless it only refers to a secret kept elsewhere (`-p"$PW"`)."""
    value = m.group("val").strip("'\"")
    if not value or _REFERENCE.fullmatch(value):
        return m.group(0)
    return m.group("pre") + MASK


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
# case-folded texts one of which a (case-insensitive) name match contains; none holds an `i`,
# which re.IGNORECASE also matches with a dotless `ı` that case folding keeps apart
_NAME_NEEDLES = ("key", "token", "secret", "pass", "credent", "auth")


# A name's segments: split at `_`, `-` and where a lower-case letter or digit meets a capital
# (accessToken, clientSecret, dbPassword: JavaScript and JSON spell names so)
_SEGMENT_SPLIT = re.compile(r"[_-]|(?<=[a-z0-9])(?=[A-Z])")
# Names that hold a secret word but whose value is not a secret: where the secret is kept
# (TOKEN_FILE, --password-file), how big or how long it is (max_tokens, TOKEN_TTL), where it is
# sent (AUTH_URL), what it is called (SECRET_NAME: a Kubernetes secret's name), `pass-through`.
_NOT_SECRET_LAST = frozenset(
    {
        *("file", "files", "path", "dir", "env"),
        *("length", "len", "count", "size", "limit", "ttl", "timeout", "expiry", "expires", "type"),
        *("url", "uri", "endpoint", "host", "port", "name", "names", "through"),
    }
)
_NOT_SECRET_FIRST = frozenset({"max", "min", "num"})


def _segments(name: str) -> list[str]:
    return [s.casefold() for s in _SEGMENT_SPLIT.split(name) if s]


def _secret_name(name: str) -> bool:
    """Whether a variable name is a secret's: one of its segments is a secret word, or ends in
    PASSWORD after a short prefix, and it does not name a secret's file, size or address."""
    folded = name.casefold()
    if not _has(folded, _NAME_NEEDLES):  # most names: no secret word in them at all
        return False
    segments = _segments(name)
    if _names_no_secret(segments):
        return False
    return any(_SECRET_SEGMENT.fullmatch(segment) for segment in segments)


def _names_no_secret(segments: list[str]) -> bool:
    """A name whose value is about a secret, not the secret (see _NOT_SECRET_LAST)."""
    return len(segments) > 1 and (segments[-1] in _NOT_SECRET_LAST or segments[0] in _NOT_SECRET_FIRST)


def secret_key(key: str) -> bool:
    """Whether a mapping's key names a secret value ({"password": ...}, {"Authorization": ...});
    a key that names a secret's file, size or address ({"max_tokens": 4096}) does not."""
    return bool(key) and SECRET_KEYS.search(key) is not None and not _names_no_secret(_segments(key))


def _mask_assignments(pattern: re.Pattern[str], text: str) -> str:
    """Every value after a secret's `name<sep>` of `pattern` in `text`, masked. The search goes
    on right after each separator, so a value is read only after a secret's name, and text is
    read a bounded number of times whatever it holds (`FOO=API_KEY=x`, `x=a=a=a...`)."""
    out: list[str] = []
    done = 0
    run = _Run()
    for m in pattern.finditer(text):  # name and separator only: one reading of the text, in C
        pos = m.end()
        if m.start() < done or not _secret_name(m.group("name")):  # inside a masked value, or not a secret
            continue
        quote = text[pos : pos + 1]
        if quote in _QUOTED:
            value = _QUOTED[quote].match(text, pos)
            if value is None or not value.group("quoted") or _REFERENCE.fullmatch(value.group("quoted")):
                continue
            end, masked = value.end(), f"{quote}{MASK}{quote}"
        elif pattern is _ASSIGN_COLON and (below := _value_below(text, pos, m.start("name"))) is not None:
            pos, end = below  # `password:` with its value on the lines under it
            masked = MASK
        else:
            end = run.end_from(text, pos)
            # `$VAR` and `$(cmd)` are not secrets but references to one: left visible, and read
            # on (`TOKEN=$X,PASSWORD=y`); a value that only holds one further on (`S$x`) is masked
            if end == pos or text[pos] in "=$`":
                continue
            masked = MASK
        out += (text[done:pos], masked)
        done = end
    out.append(text[done:])
    return "".join(out)


# what may follow a YAML key whose value is on the lines under it: a block scalar's indicator
# (`|`, `>-`, `|2+`), a comment, then the line's end
_BELOW_HEADER = re.compile(r"(?:[|>][-+0-9]{0,3})?[ \t]*+(?:#[^\n]*+)?\r?\n")
_INDENT = re.compile(r"[ \t]*+")


def _value_below(text: str, pos: int, name_at: int) -> tuple[int, int] | None:
    """A YAML value under its key (`password:` then the line's end, or `password: |`): where
    the lines more indented than the key begin and end; None when no such line follows. Each
    line is read once: the lines taken are past the next name looked at."""
    header = _BELOW_HEADER.match(text, pos)
    if header is None:
        return None
    column = name_at - (text.rfind("\n", 0, name_at) + 1)
    start = end = -1
    line = header.end()
    while line < len(text):
        indent = _INDENT.match(text, line)
        first = indent.end() if indent is not None else line
        line_end = text.find("\n", line)
        line_end = len(text) if line_end < 0 else line_end
        if first < line_end and text[first] != "\r":  # a blank line neither ends nor starts the value
            if first - line <= column:
                break
            start = first if start < 0 else start
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


def _has(text: str, needles: tuple[str, ...]) -> bool:
    for needle in needles:  # noqa: SIM110 - a loop, not any(<generator>): runs for every string journaled
        if needle in text:
            return True
    return False


def _token_step(needles: tuple[str, ...], pattern: re.Pattern[str]) -> tuple[Guard, Step]:
    return (lambda text, _folded: _has(text, needles)), (lambda text: pattern.sub(MASK, text))


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
    (lambda text, _: _has(text, _CLIENT_NAMES), _mask_client_flags),
    (lambda text, _: "pass:" in text, lambda text: _OPENSSL_PASS.sub(_masked_flag, text)),
    # "cook": re.IGNORECASE matches `ı` and `İ` with `i`, which case folding keeps apart
    (lambda _, folded: "cook" in folded, lambda text: _COOKIE.sub(lambda m: m.group("pre") + MASK, text)),
    (
        lambda text, folded: "-" in text and _has(folded, _NAME_NEEDLES),
        lambda text: _FLAG_VALUE.sub(lambda m: m.group(0) if "$" in m.group("val") else m.group("pre") + MASK, text),
    ),
    (
        lambda text, _: "-u" in text or "--user" in text,
        lambda text: _USER_PASSWORD.sub(lambda m: m.group("pre") + MASK, text),
    ),
    *(_token_step(needles, pattern) for needles, pattern in SECRET_VALUES),
    (
        lambda text, folded: "=" in text and _has(folded, _NAME_NEEDLES),
        lambda text: _mask_assignments(_ASSIGN_EQ, text),
    ),
    (
        lambda text, folded: ":" in text and _has(folded, _NAME_NEEDLES),
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
