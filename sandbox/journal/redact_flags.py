"""Secrets given on a command line (journal/redact.py's steps): a secret flag's value, curl's
`-u user:password`, the password flags of database and registry clients, OpenSSL's `pass:`."""

from __future__ import annotations

import re

from sandbox.journal.redact_names import MASK, REFERENCE, names_no_secret, segments

# a secret given as a command-line flag's next word: `--token VALUE`, `--password 'x y'`,
# `--secret-key VALUE`; not a `$VAR`, and not a redirection or a pipe (`--with-token < file`)
FLAG_VALUE = re.compile(
    r"(?P<pre>(?<![A-Za-z0-9_-])--?(?:[A-Za-z0-9]++[-_])*?"
    r"(?:token|password|passwd|passphrase|pass|secret|credentials?|(?:api|secret|private|access)[-_]?key)[ \t]++)"
    r"(?P<val>\"[^\"\n]*+\"|'[^'\n]*+'|[^\s'\"$`<>|;&=-][^\s'\"]*+)",
    re.I,
)
# curl's and wget's credentials: `-u user:password`, `--user=user:password` (the password may
# hold `@`); after a space or a line's start only; a numeric password is a uid:gid (`docker -u 0:0`)
USER_PASSWORD = re.compile(
    r"(?P<pre>(?:(?<=\s)|^)(?:-u|--user)[ \t=]*+['\"]?[^\s:'\"]{1,256}:)(?P<pw>(?![0-9]+(?:[\s'\"]|$))[^\s'\"]++)",
    re.M,
)
# Database and registry clients that take a password glued to or after a short flag, within one
# command (up to `;`, `&`, `|` or a line's end outside quotes; a `\` at a line's end goes on):
# `mysql -uroot -pS`, `sshpass -p S ssh host`, `docker login -u me -p S`, `redis-cli -a S`,
# `mongosh -u me -p S`. The flag means something else in other commands (`mkdir -p`, `ssh -p
# 22`), so it is looked for only after the client's name, and a client is the command itself
# (after `sudo`, `env`, `VAR=x` or a folder), never an argument (`find -name mysql -prune`),
# except `login`, a subcommand (`docker login`, `az acr login`), never a host (`ssh me@login`).
# OpenSSL's `-passin pass:S`.
_COMMAND = re.compile(r"""(?:'[^'\n]*+'?|"(?:[^"\\\n]|\\.)*+"?|\\\r?\n|\\.|[^;&|\n'"\\]++|\\)++""")
_FLAG_SECRET = r"""(?P<val>'[^'\n]*+'|"[^"\n]*+"|[^\s'"]++)"""  # noqa: S105 - a pattern
_BLANK = r"(?:[ \t]|\\\r?\n)"
_AS_COMMAND = (
    rf"\A{_BLANK}*+(?:(?:(?:sudo|doas|exec|env|nohup|time|nice|command)(?:[ \t]++(?:-[ug][ \t]*+[^\s-]\S*+|-\S++))*+"
    rf"|[A-Za-z_][A-Za-z0-9_]*+=\S*+){_BLANK}++)*+(?:[^\s/'\"]*+/)*+"
)
_CLIENT_FLAGS: list[tuple[re.Pattern[str], re.Pattern[str], int]] = [  # (client, flag, how many: 0 all)
    (
        re.compile(rf"{_AS_COMMAND}(?:mysql\w*+|mariadb[\w-]*+)(?![\w.@-])"),
        re.compile(rf"(?<=\s)(?P<pre>-p){_FLAG_SECRET}"),
        0,
    ),
    (  # sshpass's own options only, before the command it runs (`sshpass -f pw ssh -p 22 h`)
        re.compile(rf"{_AS_COMMAND}sshpass(?![\w.@-])"),
        re.compile(rf"\A(?P<pre>(?:{_BLANK}++-(?:[fdP][ \t]*+[^\s-]\S*+|[evhV]))*+{_BLANK}++-p[ \t]*+){_FLAG_SECRET}"),
        1,
    ),
    (
        re.compile(rf"{_AS_COMMAND}(?:mongosh|mongo)(?![\w.@-])"),
        re.compile(rf"(?<=\s)(?P<pre>-p[ \t]*+){_FLAG_SECRET}"),
        1,
    ),
    (re.compile(rf"{_AS_COMMAND}redis-cli(?![\w.@-])"), re.compile(rf"(?<=\s)(?P<pre>-a[ \t]*+){_FLAG_SECRET}"), 1),
    (re.compile(r"(?<![\w./@-])login(?![\w.@-])"), re.compile(rf"(?<=\s)(?P<pre>-p[ \t]*+){_FLAG_SECRET}"), 1),
]
CLIENT_NAMES = ("mysql", "mariadb", "sshpass", "mongo", "redis-cli", "login")
OPENSSL_PASS = re.compile(rf"(?P<pre>(?<![\w-])-pass(?:in|out)?[ \t]++pass:){_FLAG_SECRET}")


def mask_client_flags(text: str) -> str:
    """The password flags of _CLIENT_FLAGS, each command read once per client."""

    def one(command: re.Match[str]) -> str:
        part = command.group(0)
        for client, flag, count in _CLIENT_FLAGS:
            named = client.search(part)  # `\A`-anchored but `login`: one attempt at each other place
            if named is not None:
                rest = flag.sub(masked_flag, part[named.end() :], count=count)
                part = part[: named.end()] + rest
        return part

    return _COMMAND.sub(one, text)


def masked_flag(m: re.Match[str]) -> str:
    """A flag's value masked, unless it only refers to a secret kept elsewhere (`-p"$PW"`)."""
    value = m.group("val").strip("'\"")
    if not value or REFERENCE.fullmatch(value):
        return m.group(0)
    return m.group("pre") + MASK


def masked_secret_flag(m: re.Match[str]) -> str:
    """A secret flag's value (FLAG_VALUE) masked as _masked_flag does, unless the flag names a
    secret's file, size or address (`--max-token 4096`)."""
    if names_no_secret(segments(m.group("pre").strip(" \t-"))):
        return m.group(0)
    return masked_flag(m)
