"""web_fetch's own checks, before and after the sandbox fetches: what a URL may be, what a
redirect may point to, how a body becomes text (pure; the fetch itself is in test_egress_docker)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.errors import SandboxError
from sandbox.tools.handlers.web import MARK_CLOSE, Page, check_url, page_text


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "gopher://x/",
        "example.com/no-scheme",
        "http:///no-host",
        "http://user:pw@example.com/",
        "http://example.com/a b",
        "http://example.com/\nHost: other",
        "http://example.com:99999/",
        "http://example.com:port/",
        "-K/etc/passwd",
    ],
)
def test_urls_that_are_refused(url: str) -> None:
    with pytest.raises(SandboxError) as caught:
        check_url(url)
    assert caught.value.code.value == "INVALID_ARGUMENTS"


def test_urls_that_pass() -> None:
    for url in ("http://example.com", "https://pypi.org/simple/x/?a=1#f", "http://[::1]:8080/", "http://10.0.0.1/"):
        assert check_url(url) == url  # addresses are the proxy's business, not this check's


@given(st.text(min_size=1, max_size=80))
def test_no_url_reaches_curl_as_an_option_or_with_whitespace(text: str) -> None:
    """Whatever passes starts with http(s):// and has no whitespace or control character."""
    try:
        url = check_url(text)
    except SandboxError:
        return
    assert url.startswith(("http://", "https://"))
    assert not any(ch.isspace() or ord(ch) < 32 for ch in url)


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_html_becomes_readable_text_and_scripts_do_not() -> None:
    html = (
        b"<html><head><title>t</title><script>steal()</script><style>p{}</style></head>"
        b"<body><h1>Hello</h1><p>caf\xc3\xa9 <a href='/x'>link</a></p><ul><li>one</li></ul></body></html>"
    )
    text = page_text(Page("http://x/", 200, "text/html; charset=utf-8", "", html, False))
    assert "Hello" in text and "café link" in text and "* one" in text
    assert "steal" not in text and "p{}" not in text


def test_charsets_json_and_binary() -> None:
    latin = page_text(Page("http://x/", 200, "text/plain; charset=iso-8859-1", "", "café".encode("latin-1"), False))
    assert latin == "café"
    unknown = page_text(Page("http://x/", 200, "text/plain; charset=no-such", "", b"ok", False))
    assert unknown == "ok"
    assert page_text(Page("http://x/", 200, "application/json", "", b'{"a": 1}', False)) == '{"a": 1}'
    binary = page_text(Page("http://x/", 200, "image/png", "", b"\x89PNG....", False))
    assert binary.startswith("[binary content: image/png, 8 bytes")
    assert MARK_CLOSE not in binary
