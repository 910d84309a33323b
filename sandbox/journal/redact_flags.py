"""Secrets given on a command line (journal/redact.py's steps): a secret flag's value, curl's
`-u user:password`, the password flags of database and registry clients, OpenSSL's `pass:`."""

from __future__ import annotations

import bisect
import re

from sandbox.journal.redact_names import MASK, REFERENCE, has, names_no_secret, segments

# a secret given as a command-line flag's next word: `--token VALUE`, `--password 'x y'`,
# `--secret-key VALUE`, keytool's `-storepass VALUE`, `redis-server --requirepass VALUE`; not a
# `$VAR` (masked_flag), and not a redirection or a pipe (`--with-token < file`)
FLAG_VALUE = re.compile(
    r"(?P<pre>(?<![A-Za-z0-9_-])--?(?:[A-Za-z0-9]++[-_])*?(?:(?:src|dest)?(?:store|key)pass|requirepass|"
    r"secret-string|token|password|passwd|passphrase|pass|secret|credentials?|(?:api|secret|private|access)[-_]?key)"
    r"[ \t]++)(?P<val>\"[^\"\n]*+\"|'[^'\n]*+'|[^\s'\"`<>|;&=-][^\s'\"]*+)",
    re.I,
)
# curl's and wget's credentials: `-u user:password`, `--user=user:password` (the password may
# hold `@`); after a space or a line's start only; a numeric password is a uid:gid (`docker -u 0:0`)
USER_PASSWORD = re.compile(
    r"(?P<pre>(?:(?<=\s)|^)(?:-u|--user)[ \t=]*+['\"]?[^\s:'\"]{1,256}:)(?P<pw>(?![0-9]+(?:[\s'\"]|$))[^\s'\"]++)",
    re.M,
)
# Clients that take a password glued to or after a short flag, within one command (up to `;`,
# `&`, `|` or a line's end outside quotes; a `\` at a line's end goes on): `mysql -uroot -pS`,
# `sshpass -p S ssh host`, `docker login -u me -p S`, `redis-cli -a S`, `mongosh -u me -p S`,
# `zip -P S`, `7z a -pS`, `sqlcmd -P S`, `ldapsearch -w S`, `curl -b 'session=S'`. The flag
# means something else in other commands (`mkdir -p`, `ssh -p 22`, `cp -b`), so it is looked for
# only after the client's name (anywhere: `docker exec db mysql ...`, `kubectl exec pod --
# mysql ...`, `$(mysql ...)`), never a name inside a word, a path, a host, an image (`mysql:8`)
# or an option's argument (`find -name mysql -prune`, `--name mysql`).
_COMMAND = re.compile(r"""(?:'[^'\n]*+'?|"(?:[^"\\\n]|\\.)*+"?|\\\r?\n|\\.|[^;&|\n'"\\]++|\\)++""")
# a flag's value: quoted, or bare up to a blank, a quote or the `)` of a `$(...)` around the command
# (also escaped inside a quoted `bash -c "..."`, and ANSI-C quoted: `$'...'`)
_FLAG_VALUE = r"""'[^'\n]*+'|"[^"\n]*+"|\\"(?:[^"\\\n]|\\[^"\n])*+\\"|\$'[^'\n]*+'|(?:\\[^\n]|[^\s'"`)\\])++"""
_FLAG_SECRET = rf"(?P<val>{_FLAG_VALUE})"
_BLANK = r"(?:[ \t]|\\\r?\n)"
_OPTION_ARGUMENT = re.compile(r"(?:^|\s)(?:-i?name|-i?path|-wholename|-i?regex|-lname|--name|--hostname)\s++\Z")


def _client(names: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.@-])(?:{names})(?![\w.@:/-])")


_CLIENT_FLAGS: list[tuple[re.Pattern[str], re.Pattern[str], int]] = [  # (client, flag, how many: 0 all)
    (_client(r"mysql\w*+|mariadb[\w-]*+"), re.compile(rf"(?<=\s)(?P<pre>-p){_FLAG_SECRET}"), 0),
    (  # sshpass's own options only, before the command it runs (`sshpass -f pw ssh -p 22 h`)
        _client("sshpass"),
        re.compile(rf"\A(?P<pre>(?:{_BLANK}++-(?:[fdP][ \t]*+[^\s-]\S*+|[evhV]))*+{_BLANK}++-p[ \t]*+){_FLAG_SECRET}"),
        1,
    ),
    (_client("mongosh|mongo"), re.compile(rf"(?<=\s)(?P<pre>-p[ \t]*+){_FLAG_SECRET}"), 1),
    (_client("redis-cli"), re.compile(rf"(?<=\s)(?P<pre>-a[ \t]*+){_FLAG_SECRET}"), 1),
    (_client("zip"), re.compile(rf"(?<=\s)(?P<pre>-P[ \t]++){_FLAG_SECRET}"), 1),
    (_client("sqlcmd|bcp"), re.compile(rf"(?<=\s)(?P<pre>-P[ \t]*+){_FLAG_SECRET}"), 1),
    (_client(r"ldap\w++"), re.compile(rf"(?<=\s)(?P<pre>-w[ \t]++){_FLAG_SECRET}"), 1),
    (  # a cookie given on curl's or wget's command line (a value with `=`; a bare word is a file)
        _client("curl|wget"),
        re.compile(
            r"""(?P<pre>(?<=\s)(?:-b|--cookie)[ \t]++)"""
            r"""(?P<val>"[^"\n=]*+=[^"\n]*+"|'[^'\n=]*+=[^'\n]*+'|[^\s'"=]*+=[^\s'"`)]*+)"""
        ),
        0,
    ),
    (_client("7z|7za|7zz"), re.compile(rf"(?<=\s)(?P<pre>-p){_FLAG_SECRET}"), 1),
    (_client("login"), re.compile(rf"(?<=\s)(?P<pre>-p[ \t]*+){_FLAG_SECRET}"), 1),
    (_client("twine"), re.compile(rf"(?<=\s)(?P<pre>-p{_BLANK}*+){_FLAG_SECRET}"), 1),
    (  # commands that store the secret given to a flag of an ordinary name: `aws ssm put-parameter
        # --value S` (any parameter's: a SecureString's type may be given elsewhere), `az keyvault
        # secret set --value S`, `gh secret set NAME --body S` (`-b S`)
        _client(r"put-parameter|secret[ \t]++set"),
        re.compile(rf"(?<=\s)(?P<pre>(?:--value|--body)(?:{_BLANK}++|=)|-b{_BLANK}*+){_FLAG_SECRET}"),
        1,
    ),
    (  # `kubectl create [-n NS] secret generic NAME --from-literal=user=app --from-literal=pw=S`:
        # each literal's value (its key stays), quoted whole or after its key
        _client(r"create(?:[ \t]++\S++){0,8}?[ \t]++secret(?=[ \t])"),
        re.compile(
            r"""(?<=\s)(?P<pre>--from-literal(?:[ \t]++|=)(?:(?P<q1>')|(?P<q2>")|(?P<q3>\\"))?+[^\s='"\\]++=)"""
            r"""(?P<val>(?(q1)[^'\n]*+|(?(q2)[^"\n]*+|(?(q3)(?:[^"\\\n]|\\[^"\n])*+|(?:""" + _FLAG_VALUE + r""")))))"""
        ),
        0,
    ),
]
CLIENT_NAMES = (
    "mysql",
    "mariadb",
    "sshpass",
    "mongo",
    "redis-cli",
    "zip",
    "7z",
    "sqlcmd",
    "bcp",
    "ldap",
    "curl",
    "wget",
    "login",
    "twine",
    "put-parameter",
    "secret",
)
OPENSSL_PASS = re.compile(rf"(?P<pre>(?<![\w-])-pass(?:in|out)?[ \t]++pass:){_FLAG_SECRET}")
# other commands that name their secret: SQL's `IDENTIFIED BY '...'` and `[WITH|LOGIN|ENCRYPTED|
# USER name] PASSWORD '...'`, `aws configure set aws_secret_access_key ...`, a `.netrc` line
SQL_PASSWORD = re.compile(
    r"(?P<pre>\b(?:identified[ \t]++by|(?:(?:with|login|encrypted|unencrypted)[ \t]++|user[ \t]++\S++[ \t]++)password)"
    r"[ \t]++)(?P<val>'(?:[^'\n]|'')*+')",
    re.I,
)
AWS_SET = re.compile(
    r"(?P<pre>\bconfigure[ \t]++set[ \t]++(?:[\w-]++\.)?(?:aws_secret_access_key|aws_session_token)[ \t]++)"
    + _FLAG_SECRET
)
# ODBC's `Pwd=` in a connection string (`Driver={...};Server=db;Uid=sa;Pwd=S;`, also split over
# string literals, and as a keyword: `pyodbc.connect(..., uid='sa', pwd='S')`): its value quoted,
# braced (`{a;b}}c}`: `}}` is a brace; a brace not closed within 128 characters goes on to a `;`),
# or up to a `;`, a quote or the line's end (blanks inside); only with another connection-string
# key near it (`PWD` alone is the working directory: `cd x; PWD=/x make`), and never an absolute
# path (`PWD=/home/me`) or a call (`pwd = os.getcwd()`)
ODBC_PWD = re.compile(
    r"""(?P<pre>(?<![\w$.-])pwd[ \t]*+=[ \t]*+)"""
    r"""(?P<val>'[^'\n]*+'|"[^"\n]*+"|\{(?:[^}\n]|\}\}){0,128}+(?:\}|[^;'"\n]*+)|[^;'"\s{/](?:[^;'"\n]*[^;'"\s])?)""",
    re.I,
)
_ODBC_KEY = re.compile(
    r"(?<![\w.-])(?:uid|user id|server|driver|database|dsn|data source|initial catalog|trusted_connection)[ \t]*+=",
    re.I,
)
_ODBC_NEAR = 256  # how far from `Pwd=` another key is looked for
_CALL = re.compile(r"[\w.]{1,64}+\([^()\n]{0,64}+\)")
NETRC = re.compile(rf"(?P<pre>\bmachine[ \t]++\S++[ \t]++login[ \t]++\S++[ \t]++password[ \t]++){_FLAG_SECRET}")


def mask_client_flags(text: str) -> str:
    """The password flags of _CLIENT_FLAGS, each command read once per client."""

    def one(command: re.Match[str]) -> str:
        part = command.group(0)
        if not has(part, CLIENT_NAMES):  # most commands: no client named (a one-letter one, `a;a;a...`)
            return part
        for client, flag, count in _CLIENT_FLAGS:
            named = _client_in(client, part)
            if named >= 0:
                part = part[:named] + flag.sub(masked_flag, part[named:], count=count)
        return part

    return _COMMAND.sub(one, text)


def _client_in(client: re.Pattern[str], command: str) -> int:
    """Where the first `client` in `command` that is not an option's argument ends (-1: none).
    Each candidate looks back over at most 32 characters."""
    for found in client.finditer(command):
        if not _OPTION_ARGUMENT.search(command, max(0, found.start() - 32), found.start()):
            return found.end()
    return -1


def masked_flag(m: re.Match[str]) -> str:
    """A flag's value masked, unless it only refers to a secret kept elsewhere (`-p"$PW"`)."""
    value = m.group("val").strip("'\"\\")
    if not value or REFERENCE.fullmatch(value):
        return m.group(0)
    return m.group("pre") + MASK


def masked_secret_flag(m: re.Match[str]) -> str:
    """A secret flag's value (FLAG_VALUE) masked as _masked_flag does, unless the flag names a
    secret's file, size or address (`--max-token 4096`)."""
    if names_no_secret(segments(m.group("pre").strip(" \t-"))):
        return m.group(0)
    return masked_flag(m)


def mask_odbc_passwords(text: str) -> str:
    """ODBC_PWD's values masked where they are a connection string's: another of its keys within
    _ODBC_NEAR characters. The keys are found once for the whole text (looked for around each
    `Pwd=`, a line of `pwd=a;` was read 500 times over)."""
    keys = [found.start() for found in _ODBC_KEY.finditer(text)]
    if not keys:
        return text

    def one(m: re.Match[str]) -> str:
        index = bisect.bisect_left(keys, m.start() - _ODBC_NEAR)
        near = index < len(keys) and keys[index] <= m.end() + _ODBC_NEAR
        return masked_flag(m) if near and not _CALL.fullmatch(m.group("val")) else m.group(0)

    return ODBC_PWD.sub(one, text)
