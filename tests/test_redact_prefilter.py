"""The journal's redaction skips a pattern when the text lacks a literal every match needs
(journal/redact.py): the result must be exactly what running every pattern gives, for any text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.journal.redact import MASK, redact_text, redact_text_unfiltered
from tests.property_budget import examples

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
    "mysql",
    " -p",
    " -a",
    "sshpass",
    "login",
    "redis-cli",
    "pass:",
    "Digest ",
    "Proxy-",
    "|",
    ">-",
    "\n  ",
    "'] = ",
    "]",
    "accessToken",
    "ToKen",
    "max_",
    "_file",
    "mongosh",
    "sudo ",
    "A=b ",
    "\\\n",
    "#",
    "- ",
    "Negotiate ",
    "-passin ",
    "${{ x }}",
    "@",
    "value",
    "name: ",
    '\\"',
    "{",
    ",",
    "=>",
    ":=",
    "IDENTIFIED BY ",
    "machine h login u password ",
    " -b ",
    "configure set aws_session_token ",
    "hvs.",
    'b"',
    "_auth",
    "${A:-",
    "\t",
    ".",
    "<password>",
    "</password>",
    '("API_KEY", ',
    "setPassword(",
    "_PWD=",
    "Basic ",
    "curl",
    '"""',
    "put-parameter",
    " --value ",
    "secret set ",
    " --body=",
    "create secret ",
    "--from-literal=",
    "twine",
    ";Pwd=",
    "pwd=",
    "[\n",
    ",\n",
    "pypi-AgE",
    "npm_",
    "hf_",
    "SG.",
    "dop_v1_",
    '"{{ ',
    ' }}"',
    "  # c\n",
    "]",
    "Uid=u;",
    "-n ns ",
    "\\\n",
    "$'",
]

texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=40).map("".join)


@settings(max_examples=examples(600), deadline=None)
@given(texts)
def test_the_prefilter_changes_nothing(text: str) -> None:
    assert redact_text(text) == redact_text_unfiltered(text)


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=200))
def test_any_unicode_text_is_redacted_as_by_every_pattern(text: str) -> None:
    assert redact_text(text) == redact_text_unfiltered(text)


def test_look_alike_letters_still_reach_the_assignment_patterns() -> None:
    # re.IGNORECASE matches `ſ` with `s` and `ı` with `i`: the filter must not skip these
    for text in (
        "PAſſWORD=hunter2hunter2",
        "CREDENTıAL=hunter2hunter2",
        "\u212aEY=hunter2hunter2",
        "cookıe: sid=abc123abc",
        "Set-Cookİe: sid=abc123abc",
    ):
        assert redact_text(text) == redact_text_unfiltered(text)
        assert MASK in redact_text(text), text


def test_plain_text_without_any_needle_is_returned_as_is() -> None:
    text = "x" * 4095 + "\n"
    assert redact_text(text) == text


# Hostile shapes that made a masking pattern read the text once per word start (quadratic): a
# megabyte of any of them took minutes to tens of minutes on the event loop. Each is journaled
# here as a call's argument would be, whole (the loop history and approvals mask whole texts).
HOSTILE = {
    "hyphen chain of secret words": "= " + "KEY-" * 262_144,
    "underscore chain of secret words": "= " + "KEY_" * 262_144,
    "chain before a colon": "KEY-" * 262_144 + ":",
    "many -u after punctuation": ".-u" * 349_525,
    "dotted run before ://": "a." * 524_288 + "://",
    "unclosed quotes": 'a="' * 349_525,
    "one long flag": "--" + "a-" * 524_288,
    "assignments in a row": "x=" * 524_288,
    "values after a plain name": "key " + "a=" * 524_288,
    "hyphenated JWT starts": "eyJ-" * 262_144,
    "unclosed quotes after secret names": 'KEY="' * 209_715,
    "secret names before $ values": "TOKEN=$X," * 116_508,
    "secret names and $ in quotes": 'x="' + "KEY=$" * 209_715 + '"',
    "flags before =": "--token =" * 116_508,
    "glued client flags": "mysql" + " -pa" * 262_144,
    "client names and flags": "login -p " * 116_508,
    "sshpass options": "sshpass" + " -e" * 349_525,
    "yaml keys with a line below": "password:\n x\n" * 74_898,
    "yaml keys over blank lines": ("password:\n" + "\n" * 10) * 52_428,
    "yaml keys ever deeper": "".join(" " * i + "password:\n" for i in range(1_400)),
    "digest headers": "Authorization: Digest " * 47_662,
    "openssl passes": "pass:" * 209_715,
    "subscripts": "['KEY']=" * 131_072,
    "camel-case chain": "aKey" * 262_144 + "=x",
    "keys ending their line in a comment, over blank lines": '"password": #' * 40_000 + "\n" + "\n" * 528_576,
    "keys ending their line in a comment, over blank-looking lines": '"password": #' * 20_000
    + "\n"
    + "   \n" * 197_144,
    "keys ending one line in a comment": '"password": #' * 80_659,
    "lists at their key's indentation": "password:\n- a\n" * 74_898,
    "an unclosed double quote of escapes": 'mysql "' + '\\"' * 524_287,
    "single quotes": "mysql " + "'" * 1_048_570,
    "command prefixes": "sudo " * 209_714 + "mysql -pX",
    "assignments before a client": "A=b " * 262_142 + "mysql -pX",
    "name and value pairs": "- name: TOKEN\n  value: \n" * 41_943,
    "escaped quoted keys": '\\"password\\": \\"a' * 61_680,
    "option arguments before clients": "-name mysql " * 87_381 + "-pX",
    "inline object keys": "{token: {token: " * 65_536,
    "keys whose line is a default": "password: ${A:-" * 69_905,
    "comments under a key": "password:\n" + "  # c\n" * 174_760,
    "doubled single quotes": "password='" + "''" * 524_283,
    "dotted chain of secret words": "password." * 116_508 + "=x",
    "open elements": "<password>a" * 95_325,
    "calls with a secret's name": '("API_KEY", "a' * 74_898,
    "setters": 'setPassword("' * 80_659,
    "pairs with members between": '{"name": "TOKEN", "a": "b", "c": 1, ' * 29_127,
    "an env line of separators": "PASSWORD=" + "x&" * 524_283,
    "unclosed quotes under keys": 'password: "a\\\n' * 74_898,
    "cookies after a client": "curl" + " -b a=" * 174_762,
    "one-letter commands after a client": "mysql " + "a;" * 524_285,
    "lists opened under keys": '"password": [\n' * 87_381,
    "unclosed lists of elements": 'password: [\n "a",\n' * 58_254,
    "lists of elements under every key": 'password: [\n"a",\npassword: [\n' * 34_952,
    "odbc passwords": ";pwd=" * 209_715,
    "odbc passwords before keys": "pwd=a;b=" * 131_072,
    "secret-set values": "gh secret set -b " * 61_680,
    "literals of a secret": "create secret --from-literal='a=" * 32_768,
    "templates opened in quotes": 'password: "{{ "' * 69_905,
    "commented-out lists": "# password = [\n" * 65_536,
    "lists over blank lines": "password = [\n\n" * 74_898,
    "headers inside elements": 'API_KEYS = [\n"a", API_KEYS = [\n' * 37_449,
    "odbc braces near keys": "server=;pwd={" * 80_659,
    "kubectl literals after flags": 'create -n a secret --from-literal=a="b' * 27_594,
    "lists opened before a comment": "key=[ #" * 149_796,
    "keys of lists before a comment": ",password:[#" * 87_381,
    "odbc passwords and keys": "pwd=a;" * 174_762,
    "lists opened on their line": 'password=["a", ' * 69_905,
    "unquoted lists with names in comments": "a, #password=[a,\n" * 61_680,
    "unquoted lists, short lines": "a#key=[a\n" * 116_508,
    "unquoted tuples with names in comments": "a, #,password:(a,\n" * 58_254,
}
LIVENESS = """
import sys
from sandbox.journal.redact import redact_text
from tests.test_redact_prefilter import HOSTILE
for text in HOSTILE.values():
    redact_text(text)
print("done")
"""


@pytest.mark.slow  # about 5 s in its own interpreter: the full suite's, not the quick loop's
def test_hostile_megabytes_are_masked_in_one_reading() -> None:
    """Not a speed claim: a liveness bound. Each shape is masked in linear time (0.01-0.2 s a
    megabyte here); read once per word start, any of them took minutes, so a 300 s bound for all
    of them cannot fail on a slow machine, and does fail on a quadratic pattern."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    run = subprocess.run(
        [sys.executable, "-c", LIVENESS], cwd=root, capture_output=True, text=True, timeout=300, check=True
    )
    assert run.stdout.strip() == "done"
