"""Secrets given to a name (journal/redact.py's steps): `NAME=value`, `name: value`, a YAML value
under its key, and `{"name": "DB_PASSWORD", "value": ...}` pairs.

Every text is read in linear time whatever it holds: a name is read possessively, a value only
after a secret's name, and a key's lines below it only for a key that is the first thing on its
line (at most one a line).
"""

from __future__ import annotations

import re

from sandbox.journal.redact_names import MASK, REFERENCE, secret_name

# A name is one whole word (one leading `_` allowed: `.npmrc`'s `_authToken`; dotted:
# `spring.datasource.password`), taken possessively (never given back: `KEY-KEY-KEY-...` is read
# once), starting at a word's start (never inside a hyphenated or dotted one: `a.a.a...` read
# from each dot was quadratic); whether it is secret is decided on its segments (secret_name).
_WORD = r"(?<![A-Za-z0-9_])(?<![A-Za-z0-9][.-])(?P<name>_?+[A-Za-z0-9]++(?:[_.-][A-Za-z0-9]++)*+)"
# NAME= anywhere (shell, URLs, flags, .env files), a subscript's `['NAME'] =` (os.environ), a
# quoted name (`'password' => ...`), Go's `:=`, PHP's and Ruby's `=>`
ASSIGN_EQ = re.compile(rf"""{_WORD}(?P<sep>(?:["']\]?)?[ \t]*+:?=>?[ \t]*+)""", re.I)
# NAME: only where it is a key: at a line's start (YAML, headers), quoted (JSON, also escaped
# inside a shell string: `-d "{\"password\": ...}"`), or after `{` or `,` (`{ apiKey: "..." }`);
# elsewhere a colon is ordinary text (`echo PASS: done`)
ASSIGN_COLON = re.compile(
    rf"""(?P<lead>^[ \t-]*+\\?["']?|\\?["']|[{{,][ \t]*+){_WORD}(?P<sep>\\?["']?[ \t]*+:[ \t]*+)""", re.I | re.M
)
# `{"name": "DB_PASSWORD", "value": ...}`, `- name: DB_PASSWORD` then `value: ...` on the next
# line, `<add key="ApiKey" value="..."/>`: the value of a pair whose name is a secret's
PAIR = re.compile(
    r"""\b(?:name|key)\\?["']?[ \t]*+[:=][ \t]*+\\?["']?(?P<name>[A-Za-z0-9_./-]{1,128}+)\\?["']?[ \t]*+,?[ \t]*+"""
    # up to four members between (`"Type": "SecureString",`), a comment line, a line's end
    r"""(?:\\?["'][A-Za-z0-9_]{1,32}+\\?["'][ \t]*+:[ \t]*+"""
    r"""(?:"[^"\n]{0,256}+"|[A-Za-z0-9_.-]{1,64}+)[ \t]*+,[ \t]*+){0,4}+"""
    r"""(?:\r?\n[ \t]*+#[^\n]*+)?(?:\r?\n[ \t-]*+)?\\?["']?value\\?["']?[ \t]*+[:=][ \t]*+""",
    re.I,
)
# `<password>...</password>` (Maven's settings.xml), and a call given a secret's name then its
# value: `setenv("API_KEY", "...")`, `os.environ.get("PW", "...")`, `req.Header.Set("Authorization",
# "Basic ...")`, `ds.setPassword("...")`
ELEMENT = re.compile(r"<(?P<name>[A-Za-z][\w.:-]{0,63}+)>(?P<val>[^<\n]{1,4096}+)</(?P=name)>")
CALL = re.compile(
    r"""(?:\(\s*+["'](?P<name>[\w./-]{1,64}+)["']\s*+,\s*+|\bset(?P<setter>[A-Z]\w{0,63}+)\(\s*+)"""
    r"""(?P<val>"(?:[^"\\\n]|\\.)*+"|'[^'\n]*+')"""
)


def mask_named_literals(text: str) -> str:
    """The values of ELEMENT and CALL whose name is a secret's (a quoted value's quotes stay; an
    Authorization value keeps its scheme)."""

    def one(m: re.Match[str]) -> str:
        name = m.group("name") or m.groupdict().get("setter") or ""
        if not secret_name(name):
            return m.group(0)
        start, end = m.start("val") - m.start(), m.end("val") - m.start()
        whole = m.group(0)
        if end - start >= 2 and whole[start] in "\"'" and whole[end - 1] == whole[start]:
            start, end = start + 1, end - 1  # a quoted value's quotes stay
        if REFERENCE.fullmatch(whole, start, end):  # `setenv("API_KEY", "$KEY")`: a reference stays
            return whole
        scheme = _SCHEME.match(whole, start, end) if name.casefold().endswith("authorization") else None
        start = scheme.end() if scheme is not None else start
        return whole[:start] + MASK + whole[end:] if end > start else whole

    return CALL.sub(one, ELEMENT.sub(one, text))


# a value: quoted to the end of its line (the other quote allowed inside: `"it's"`; `\"` inside
# double quotes, `''` inside single ones), quoted with escaped quotes (`\"...\"`), after a
# string prefix (`b"..."`, `f'...'`), or bare (a run of these characters, not starting with `=`)
_QUOTED = {
    '"': re.compile(r'"(?P<quoted>(?:[^"\\\n]|\\.)*+)"'),
    "'": re.compile(r"'(?P<quoted>(?:[^'\n]|'')*+)'"),
    "\\": re.compile(r"""\\(?P<q>["'])(?P<quoted>(?:[^"'\\\n]|\\[^"'\n])*+)\\(?P=q)"""),
}
_STRING_PREFIX = re.compile(r"""[bBrRuUfF]{1,2}+(?=["'])""")
_BARE_RUN = re.compile(r"""[^\s;&|'"`<>()]*+""")
_UNQUOTED_RUN = re.compile(r"""[^\s'"]*+""")  # an unclosed quote's value, a scheme's token
_BLANK_IN = re.compile(r"[ \t]")
# HTTP authorization schemes: `Authorization: Bearer ***` keeps its scheme (a token after it)
_SCHEME = re.compile(r"(?:bearer|basic|token|digest|negotiate|ntlm)[ \t]++(?=\S)", re.I)


def mask_assignments(pattern: re.Pattern[str], text: str) -> str:
    """Every value after a secret's `name<sep>` of `pattern` (ASSIGN_EQ, ASSIGN_COLON, PAIR) in
    `text`, masked. The search goes on right after each separator, so a value is read only after
    a secret's name, and text is read a bounded number of times whatever it holds
    (`FOO=API_KEY=x`, `x=a=a=a...`)."""
    out: list[str] = []
    done = 0
    run = _Run()
    for m in pattern.finditer(text):  # name and separator only: one reading of the text, in C
        if m.start() < done or not secret_name(m.group("name")):  # inside a masked value, or not a secret
            continue
        first_on_line = m.start() == 0 or text[m.start() - 1] == "\n"
        # code's `:=`, `=>` and an object's `{ key: ...`: only a quoted value is a secret's
        # (`token := lexer.Next()`, `key => obj[key]` are code)
        sep = m.group("sep") if pattern is not PAIR else ""
        literal = "=>" in sep or ":=" in sep
        if pattern is ASSIGN_COLON:
            literal = literal or m.group("lead").startswith(("{", ","))
            keyed = first_on_line and not literal  # a YAML key or a header (one such name a line)
        else:
            keyed = False
        found = _value(text, m.end(), m, keyed, run, literal=literal, line_start=first_on_line)
        if found is None:
            continue
        start, end, masked = found
        out += (text[done:start], masked)
        done = end
    out.append(text[done:])
    return "".join(out)


def _value(
    text: str, pos: int, m: re.Match[str], keyed: bool, run: _Run, *, literal: bool = False, line_start: bool = False
) -> tuple[int, int, str] | None:
    """Where the value at `pos` of the name `m` found begins and ends, and what replaces it; None
    when it is empty or only refers to a secret kept elsewhere (or is code, where only a
    `literal` counts)."""
    authorization = m.group("name").casefold().endswith("authorization")
    prefix = _STRING_PREFIX.match(text, pos)
    if prefix is not None:
        pos = prefix.end()
    opening = text[pos : pos + 1]
    if opening in _CLOSERS:
        # `"api_keys": [` then its elements, on its line or the lines below (or none: `[` alone
        # at a line's end is no secret)
        elements = _list_below(text, pos + 1, _CLOSERS[opening], bare_values=keyed)
        if elements is not None or _OPENED.match(text, pos + 1) is not None:
            return elements
    if keyed and (typed := _ANNOTATION.match(text, pos)) is not None and _OPENED.match(text, typed.end()):
        return _list_below(text, typed.end(), "]", bare_values=False)  # `API_KEYS: list[str] = [`
    if text.startswith(('"""', "'''"), pos):  # a triple-quoted string, read up to 64 KiB
        close = text.find(text[pos : pos + 3], pos + 3, pos + 65_536)
        return None if close <= pos + 3 else (pos + 3, close, MASK)
    if opening == '"' and (template := _quoted_template(text, pos + 1)) is not None:
        return pos + 1, template, MASK  # `"{{ .Values.pw | default "S" }}"`: quotes inside quotes
    if opening in _QUOTED:
        value = _QUOTED[opening].match(text, pos)
        if value is None:  # not closed on its line (`"S\`): masked to the line's end, or a blank
            end = _line_value_end(text, pos + 1) if keyed else _UNQUOTED_RUN.match(text, pos + 1).end()  # type: ignore[union-attr]
            return (pos + 1, end, MASK) if end > pos + 1 else None
        inner, left, right = value.group("quoted"), value.start("quoted"), value.end("quoted")
        if not inner or REFERENCE.fullmatch(inner):
            return None
        scheme = _SCHEME.match(inner) if authorization else None
        return (left + scheme.end(), right, MASK) if scheme is not None else (left, right, MASK)
    if literal:
        return None
    if keyed and (below := _value_below(text, pos, m.start("name") - m.start())) is not None:
        return below[0], below[1], MASK  # `password:` with its value on the lines under it
    # a key's value is the rest of its line (YAML's `passphrase: correct horse battery`), less a
    # comment; so is an .env or INI line's when it holds no blank (`DB_PASSWORD=Xy7&kP(9)q;z`);
    # elsewhere the run of value characters
    if keyed:
        end = _line_value_end(text, pos)
    else:
        end = run.end_from(text, pos)
        if line_start and end > pos:
            line_end = _line_value_end(text, pos)
            if not _BLANK_IN.search(text, pos, line_end):
                end = line_end
    if end == pos or text[pos] in ("=#" if keyed else "="):
        return None
    # `$VAR` and `$(cmd)` are not secrets but references to one: left visible, and read on
    # (`TOKEN=$X,PASSWORD=y`); a value with a literal in it (`S$x`, `${PW:-default}`) is masked
    if keyed and REFERENCE.fullmatch(text, pos, end):
        return None
    if not keyed and (text.startswith(("$(", "`"), pos) or (text[pos] == "$" and REFERENCE.match(text, pos))):
        return None
    scheme = _SCHEME.match(text, pos) if authorization else None
    if scheme is not None:  # `Authorization: Bearer ***`: the scheme stays, its token goes
        token = _UNQUOTED_RUN.match(text, scheme.end())
        if token is None or token.end() == scheme.end() or REFERENCE.fullmatch(token.group(0)):
            return None  # `Bearer $T`: a reference
        return scheme.end(), token.end(), MASK
    return pos, end, MASK


# a list (or a tuple) of elements: quoted strings (with a string prefix: `b"..."`) or bare words,
# any number a line, each followed by a comma or by the bracket that closes it; on the line that
# opens it and the lines below, a line ending in a comment, blank and comment lines between. A
# comment is read at most 128 characters (a secret's name inside one, read again to its end by
# each, was quadratic)
_CLOSERS = {"[": "]", "(": ")"}
_COMMENT = r"(?:(?:#|//)[^\n]{0,128}+)?"
_OPENED = re.compile(rf"[ \t]*+{_COMMENT}\r?\n")
_ELEMENT = re.compile(
    r"""(?P<prefix>[bBrRuUfF]{1,2}+(?=["']))?+(?P<el>"(?:[^"\\\n]|\\.)*+"|'(?:[^'\\\n]|\\.)*+'|[^\s,\[\]{}()"'#]++)"""
    r"""[ \t]*+(?P<sep>,|(?=[\])]))?+[ \t]*+"""
)
_LINE_REST = re.compile(rf"{_COMMENT}(?:\r?\n|\Z)")
_SKIPPED_LINE = re.compile(rf"[ \t]*+{_COMMENT}\r?\n")
# a bare element that is code or a constant (`process.env.KEY`, `true`), not a secret
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$]*+(?:\.[A-Za-z_$][\w$]*+)*+")
_CONSTANT = frozenset({"true", "false", "null", "none", "yes", "no", "~"})
# a typed name before the list: `API_KEYS: list[str] = [`, `API_KEYS: Final = [`
_ANNOTATION = re.compile(r"[\w.\[\], |]{1,64}+=[ \t]*+\[")


def _list_below(text: str, pos: int, closer: str, *, bare_values: bool) -> tuple[int, int, str] | None:
    """The elements of a list under a secret's name (`"api_keys": [`, `API_TOKENS = ["a",`,
    `API_KEYS = (`), each masked (quotes, commas and comments stay; a bare identifier stays unless
    `bare_values`: YAML's flow list, where a bare word is a value, a dotted name still code's;
    a constant always stays): up to the `closer`, or the first line that is not elements (a
    nested list or mapping). Each line is read once. None when no element follows."""
    head = _OPENED.match(text, pos)
    out: list[str] = []
    first = done = -1
    line = head.end() if head is not None else pos  # elements on the opening line, then below
    quoted = False
    skips = 0  # blank and comment lines in a row: a few at most (a run of commented-out lists,
    # each read on to the next element, was read once per list: quadratic)
    while line < len(text):
        skipped = _SKIPPED_LINE.match(text, line)
        if skipped is not None:
            skips += 1
            if skips > _MAX_SKIPPED:
                break
            line = skipped.end()
            continue
        skips = 0
        at = _INDENT_RUN.match(text, line).end()  # type: ignore[union-attr]
        found: list[tuple[int, int]] = []
        closed = False
        while (element := _ELEMENT.match(text, at)) is not None:
            found.append(element.span("el"))
            at = element.end()
            if text.startswith(closer, at):
                closed = True
                break
            if element.group("sep") is None:
                break
        rest = _LINE_REST.match(text, at) if not closed else None
        if not found or (not closed and rest is None):
            break  # not a line of elements: the list ends above it
        for start, end in found:
            quoted = quoted or text[start] in "\"'"
            first = start if first < 0 else first
            out.append(text[done:start] if done >= 0 else "")
            out.append(_masked_element(text, start, end, bare_values=bare_values))
            done = end
        if head is None and not quoted:
            # on its opening line, only quoted elements make a list (`[x for x in y]`); nothing
            # below it is read (read and given up, those lines were read again from each secret
            # name in their comments: quadratic)
            return None
        if closed or rest is None:
            break
        line = rest.end()
    return (first, done, "".join(out)) if first >= 0 else None


def _masked_element(text: str, start: int, end: int, *, bare_values: bool) -> str:
    quoted = text[start] in "\"'"
    inner = (start + 1, end - 1) if quoted else (start, end)
    if inner[0] >= inner[1] or REFERENCE.fullmatch(text, *inner) is not None:
        return text[start:end]
    word = text[start:end]
    if not quoted and (
        word.casefold() in _CONSTANT
        or (_IDENTIFIER.fullmatch(word) is not None and (not bare_values or "." in word))  # code's
    ):
        return word
    return text[start : inner[0]] + MASK + text[inner[1] : end]


_INDENT_RUN = re.compile(r"[ \t]*+")
_MAX_SKIPPED = 16


def _quoted_template(text: str, pos: int) -> int | None:
    """Where a template that holds quotes of its own ends (`{{ .Values.pw | default "S" }}` inside
    a double-quoted value): after its `}}`, looked for up to 512 characters on its line; None when
    it is no such template (a reference without quotes inside is one: REFERENCE keeps it)."""
    if not text.startswith("{{", pos):
        return None
    line_end = text.find("\n", pos, pos + 512)
    close = text.find("}}", pos + 2, line_end if line_end >= 0 else pos + 512)
    return close + 2 if close >= 0 and '"' in text[pos:close] else None


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
# a line that is a mapping's key (or a list of mappings): the key's value is a mapping, whose
# own keys are judged each
_KEY_LINE = re.compile(r"""(?:-[ \t]++)?["']?[^\s:'"#-][^\s:'"]*+["']?[ \t]*+:(?=[ \t\r\n]|\Z)""")


def _value_below(text: str, pos: int, column: int) -> tuple[int, int] | None:
    """A YAML value under its key at `column` (`password:` then the line's end, or `password:
    |`): where the lines more indented than the key (or a list at its indentation) begin and
    end; None when no such line follows, the first is a key of its own, or it is indented with a
    tab (not YAML: a Makefile's recipe). Comment lines neither begin nor end it. The key is the
    first thing on its line, so each line is read once: the lines taken are past the next name."""
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
        if first < line_end and text[first] not in "\r#":  # blank and comment lines are passed over
            depth = first - line
            if depth < column or (depth == column and text[first] != "-"):
                break
            if start < 0:
                if "\t" in text[line:first] or _KEY_LINE.match(text, first):
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
