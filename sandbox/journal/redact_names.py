"""The words of secret masking (journal/redact.py): which names hold secrets, which values only
refer to one, and the mask itself."""

from __future__ import annotations

import re

MASK = "***"

# Words that make a variable name secret when they are one of its segments (split at `_`, `-`
# and camel case): API_TOKEN, FOO_SECRET, AWS_SECRET_ACCESS_KEY, X-Api-Key, accessToken,
# Authorization, password, and a password with a short prefix glued on (PGPASSWORD); never
# MONKEY, KEYBOARD or PWD. A segment is matched whole and case-insensitively, as the patterns
# are (`ſ`, `ı`, the Kelvin sign).
_SECRET_SEGMENT = re.compile(
    r"keys?|apikey|passwd|pass|passphrase|passcode|auth|authorization"
    # a secret word with a short prefix glued on: PGPASSWORD, APITOKEN, accesstoken, JWTSECRET
    r"|[a-z0-9]{0,16}(?:passwords?|tokens?|secrets?|credentials?|cookies?)"
    # joined names whose last word alone would say nothing (PGPASS, secretaccesskey)
    r"|(?:pg|db|user|admin|root|smtp|mail|ftp|redis|mysql|ldap|ssh)pass"
    r"|(?:access|secret|private|api|app|client|master|signing|encryption|license|secretaccess)key",
    re.I,
)
# a value that only refers to a secret kept elsewhere: `$VAR`, `${VAR}`, `$(cmd)`, a backquoted
# command, a template's `${{ secrets.X }}` or `{{ .Values.password }}`; never one with a literal
# in it (`${PW:-hunter2}`, `{{ pw | default('hunter2') }}`: no quotes in a template)
# (each read at most so far: a run of unclosed ones is read in linear time)
_TEMPLATE = r"""\{\{[^}'"\n]{0,256}+\}\}"""
REFERENCE = re.compile(
    rf"\$(?:[A-Za-z_][A-Za-z0-9_]*+|{_TEMPLATE}|\{{[A-Za-z_][A-Za-z0-9_]*+\}}|\([^)\n]{{0,1024}}+\))"
    rf"|`[^`\n]{{0,1024}}+`|{_TEMPLATE}"
)

# case-folded texts one of which a (case-insensitive) name match contains; none holds an `i`,
# which re.IGNORECASE also matches with a dotless `ı` that case folding keeps apart
NAME_NEEDLES = ("key", "token", "secret", "pass", "credent", "auth", "cook", "pwd")


# A name's segments: split at `_`, `-`, `.`, `/` (spring.datasource.password, /prod/db/password)
# and where a lower-case letter or digit meets a capital (accessToken, clientSecret: JavaScript)
_SEGMENT_SPLIT = re.compile(r"[_./-]|(?<=[a-z0-9])(?=[A-Z])")
# Names that hold a secret word but whose value is not a secret: where the secret is kept
# (TOKEN_FILE, --password-file), how big or how long it is (max_tokens, TOKEN_TTL), where it is
# sent (AUTH_URL), what it is called (SECRET_NAME: a Kubernetes secret's name), `pass-through`.
_NOT_SECRET_LAST = frozenset(
    {
        *("file", "files", "path", "dir", "env"),
        *("length", "len", "count", "size", "limit", "ttl", "timeout", "expiry", "expires", "type"),
        *("lengths", "counts", "sizes", "limits", "types", "method", "methods", "hashers", "validators"),
        *("url", "uri", "endpoint", "host", "port", "name", "names", "through"),
    }
)
# LLM usage counts (input_tokens, total_tokens) and sizes (max_tokens)
_NOT_SECRET_FIRST = frozenset({"max", "min", "num", "input", "output", "total", "prompt", "completion", "cached"})


def segments(name: str) -> list[str]:
    """A name's segments, case-folded."""
    return [s.casefold() for s in _SEGMENT_SPLIT.split(name) if s]


def secret_name(name: str) -> bool:
    """Whether a variable name is a secret's: one of its segments is a secret word, or ends in
    PASSWORD after a short prefix, and it does not name a secret's file, size or address."""
    folded = name.casefold()
    if not has(folded, NAME_NEEDLES):  # most names: no secret word in them at all
        return False
    parts = segments(name)
    if names_no_secret(parts):
        return False
    # MYSQL_PWD, DB_PWD: `pwd` after a prefix (alone it is the working directory)
    return any(_SECRET_SEGMENT.fullmatch(part) for part in parts) or (len(parts) > 1 and parts[-1] == "pwd")


def names_no_secret(parts: list[str]) -> bool:
    """A name (its segments) whose value is about a secret, not the secret (see _NOT_SECRET_LAST)."""
    return len(parts) > 1 and (parts[-1] in _NOT_SECRET_LAST or parts[0] in _NOT_SECRET_FIRST)


def secret_key(key: str) -> bool:
    """Whether a mapping's key names a secret value ({"password": ...}, {"Authorization": ...},
    {"cookies": ...}): judged as a variable's name, so {"max_tokens": 4096}, {"author": ...} and
    {"input_tokens": 10} keep their values."""
    return len(key) <= 256 and secret_name(key)


def has(text: str, needles: tuple[str, ...]) -> bool:
    """Whether `text` holds one of `needles` (a step's guard)."""
    for needle in needles:  # noqa: SIM110 - a loop, not any(<generator>): runs for every string journaled
        if needle in text:
            return True
    return False
