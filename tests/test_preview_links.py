"""Preview links, notes of closed sessions, the headers a preview passes and drops, and where a
preview shows up (explain, audit, config errors): pure logic, as attacks where the input is a
stranger's (a link is text anyone may alter)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.audit.config_rules import audit_config
from sandbox.config import load_config_text
from sandbox.errors import ConfigError
from sandbox.policy import explain_data, explain_text
from sandbox.policy.resolver import Identity, PolicyResolver
from sandbox.preview.closed import KEEP_S, closed_since, mark_closed
from sandbox.preview.http_proxy import request_headers, response_headers
from sandbox.preview.links import KEY_FILE, LinkRefused, PreviewLink, load_key, sign, verify
from tests.property_budget import examples

KEY = b"k" * 32
NOW = 1_800_000_000
LINK = PreviewLink(
    tenant="acme", token="ci", token_sha="0123456789abcdef", agent="alpha", session="agent:alpha:web", port=8000,
    sandbox="c0ffee" * 10, issued=NOW - 5, expires=NOW + 600,
)  # fmt: skip


def test_a_link_round_trips_and_names_exactly_what_it_grants() -> None:
    text = sign(KEY, LINK)
    assert verify(KEY, text, now=NOW) == LINK
    assert all(c.isalnum() or c in "-_." for c in text)  # it goes into a URL path as it is


def test_another_key_an_expired_link_and_strangers_text_are_refused() -> None:
    text = sign(KEY, LINK)
    with pytest.raises(LinkRefused, match="signature"):
        verify(b"x" * 32, text, now=NOW)
    with pytest.raises(LinkRefused, match="expired"):
        verify(KEY, text, now=LINK.expires)
    for junk in ("", "v1", "v1..", "v2." + text[3:], "a.b.c.d", "v1.e30." + "A" * 43, "x" * 5000):
        with pytest.raises(LinkRefused):
            verify(KEY, junk, now=NOW)


@settings(max_examples=examples(300))
@given(st.data())
def test_any_change_to_a_link_is_refused(data: st.DataObject) -> None:
    """Altering any character, or swapping in a payload of another grant, never yields a grant."""
    text = sign(KEY, LINK)
    index = data.draw(st.integers(0, len(text) - 1))
    new = data.draw(st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."))
    altered = text[:index] + new + text[index + 1 :]
    if altered == text:
        return
    try:
        grant = verify(KEY, altered, now=NOW)
    except LinkRefused:
        return
    # base64's padding bits: a last character that decodes to the same bytes is the same link
    assert grant == LINK


@given(port=st.integers(1, 65535), session=st.text(min_size=1, max_size=256))
def test_a_payload_from_one_link_with_anothers_signature_is_refused(port: int, session: str) -> None:
    mine = sign(KEY, LINK)
    other = replace(LINK, port=port, session=session)
    theirs = sign(KEY, other)
    if other == LINK:
        return
    swapped = ".".join([*theirs.split(".")[:2], mine.split(".")[2]])
    with pytest.raises(LinkRefused, match="signature"):
        verify(KEY, swapped, now=NOW)


def test_the_key_is_made_once_private_and_a_bad_key_file_names_its_key(tmp_path: Path) -> None:
    first = load_key(None, tmp_path)
    assert len(first) == 32 and load_key(None, tmp_path) == first
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name != KEY_FILE]  # no temp file left
    short = tmp_path / "short.key"
    short.write_bytes(b"abc")
    with pytest.raises(ConfigError, match=r"service\.preview_key_file: .* 3 bytes"):
        load_key(short, tmp_path)
    with pytest.raises(ConfigError, match=r"service\.preview_key_file: cannot read"):
        load_key(tmp_path / "missing.key", tmp_path)
    good = tmp_path / "good.key"
    good.write_bytes(os.urandom(48))
    assert load_key(good, tmp_path) == good.read_bytes().strip()


def test_a_closed_session_ends_links_made_before_and_old_notes_are_swept(tmp_path: Path) -> None:
    assert not closed_since(tmp_path, "acme", "agent:alpha:web", NOW)
    mark_closed(tmp_path, "acme", "agent:alpha:web", now=NOW)
    assert closed_since(tmp_path, "acme", "agent:alpha:web", NOW - 1)  # made before the close
    assert not closed_since(tmp_path, "acme", "agent:alpha:web", NOW + 1)  # made after it
    assert not closed_since(tmp_path, "globex", "agent:alpha:web", NOW - 1)  # another tenant's key
    mark_closed(tmp_path, "acme", "later", now=NOW + KEEP_S + 10)
    assert not closed_since(tmp_path, "acme", "agent:alpha:web", NOW - 1)  # swept: no link lives that long
    assert len(list((tmp_path / "preview-closed").iterdir())) == 1


def test_credentials_never_reach_the_sandbox_and_cookies_never_reach_the_browser() -> None:
    sent = request_headers(
        [
            (b"Authorization", b"Bearer sbx_secret"), (b"Cookie", b"sbx_console=abc"), (b"Host", b"svc:8787"),
            (b"Connection", b"keep-alive, X-Secret"), (b"Transfer-Encoding", b"chunked"), (b"Forwarded", b"for=1"),
            (b"Accept", b"text/html"), (b"X-Forwarded-For", b"10.0.0.1"), (b"X-Secret", b"named by Connection"),
        ],
        port=5173, prefix="/v1/previews/LINK", host=b"svc:8787", scheme="http",
    )  # fmt: skip
    names = [k.lower() for k, _ in sent]
    for gone in (b"authorization", b"cookie", b"connection", b"transfer-encoding", b"forwarded", b"x-forwarded-for",
                 b"x-secret"):  # fmt: skip
        assert gone not in names
    assert (b"host", b"localhost:5173") in sent and (b"accept", b"text/html") in [(k.lower(), v) for k, v in sent]
    assert names.count(b"host") == 1
    back = response_headers(
        [(b"Set-Cookie", b"sbx_console=forged; Path=/ui"), (b"Content-Type", b"text/html"),
         (b"Referrer-Policy", b"unsafe-url"), (b"Upgrade", b"h2c"), (b"Clear-Site-Data", b'"cookies"'),
         (b"NEL", b'{"report_to":"x"}'), (b"Report-To", b"{}"), (b"Strict-Transport-Security", b"max-age=1"),
         (b"Alt-Svc", b'h3=":443"'), (b"WWW-Authenticate", b"Basic"), (b"Connection", b"X-Internal"),
         (b"X-Internal", b"1"), (b"X-App", b"1"), (b"ETag", b'"1"'), (b"Content-Length", b"10")],
        200,
    )  # fmt: skip
    lowered = {k.lower(): v for k, v in back}
    for gone in (b"set-cookie", b"upgrade", b"clear-site-data", b"nel", b"report-to", b"strict-transport-security",
                 b"alt-svc", b"www-authenticate", b"x-internal", b"connection"):  # fmt: skip
        assert gone not in lowered, gone
    assert lowered[b"x-app"] == b"1" and lowered[b"etag"] == b'"1"' and lowered[b"content-length"] == b"10"
    for status, extra in ((304, []), (204, []), (200, [(b"Transfer-Encoding", b"chunked")])):
        framed = {k.lower() for k, _ in response_headers([(b"Content-Length", b"1234"), *extra], status)}
        assert b"content-length" not in framed and b"transfer-encoding" not in framed
    assert lowered[b"referrer-policy"] == b"no-referrer"
    csp = lowered[b"content-security-policy"]
    assert csp.startswith(b"sandbox ") and b"allow-same-origin" not in csp


def test_preview_ports_are_checked_and_shown_by_explain_and_the_audit() -> None:
    with pytest.raises(ConfigError, match=r"preview\.ports"):
        load_config_text("agents: {defaults: {sandbox: {preview: {ports: [3000, 3000]}}}}")
    with pytest.raises(ConfigError, match=r"preview\.ports"):
        load_config_text("agents: {defaults: {sandbox: {preview: {ports: [70000]}}}}")
    with pytest.raises(ConfigError, match=r"link_ttl_s"):
        load_config_text("agents: {defaults: {sandbox: {preview: {link_ttl_s: 30}}}}")
    config = load_config_text(
        "agents: {defaults: {sandbox: {mode: all, scope: agent, session_users: off, preview: {ports: [5173, 3000]}}}}"
    )
    policy = PolicyResolver(config).resolve(Identity("main", "agent:main:web"))
    assert explain_data(policy)["preview"]["ports"] == [3000, 5173]
    assert "preview  ports 3000, 5173" in explain_text(policy)
    rules = {f.rule: f for f in audit_config(config)}
    assert "3000, 5173" in rules["SBX-V001"].evidence and rules["SBX-V002"].severity == "medium"
    off = load_config_text("agents: {defaults: {sandbox: {mode: all}}}")
    quiet = PolicyResolver(off).resolve(Identity("main", "agent:main:web"))
    assert "preview  off" in explain_text(quiet)
    assert not [f for f in audit_config(off) if f.rule.startswith("SBX-V")]


def test_time_is_not_frozen_by_the_tests() -> None:
    # the links above use a fixed clock; a link made now verifies now
    now_link = replace(LINK, issued=time.time(), expires=int(time.time()) + 60)
    assert verify(KEY, sign(KEY, now_link)) == now_link


def test_a_link_names_its_token_by_hash_so_a_token_made_again_under_its_name_is_another(tmp_path: Path) -> None:
    """Revoking a leaked token and making its replacement under the same name (a rotation) must
    not bring the leaked token's links back; nor may a stored token that shares a config token's
    name keep its links after it is revoked."""
    from sandbox.api.tenants import Tenants, bearer_token, create_token, revoke_token, token_hash

    config = load_config_text(f"""
state_dir: {tmp_path}
tenants: [{{id: acme, tokens: [{{name: ci, sha256: {"a" * 64}}}]}}]
agents: {{list: [{{id: alpha, tenant: acme, default: true}}]}}
""")
    tenants = Tenants(config)
    leaked = create_token(config, "acme", "deploy")
    prefix = token_hash(bearer_token(f"Bearer {leaked}") or "")[:16]  # what a link records
    assert tenants.holder("acme", "deploy", prefix) is not None
    revoke_token(config, "acme", "deploy")
    assert tenants.holder("acme", "deploy", prefix) is None
    create_token(config, "acme", "deploy")  # the replacement, same name
    assert tenants.holder("acme", "deploy", prefix) is None
    twin = create_token(config, "acme", "ci")  # a stored token named like the config's
    twin_prefix = token_hash(twin)[:16]
    assert tenants.holder("acme", "ci", twin_prefix) is not None
    revoke_token(config, "acme", "ci")
    assert tenants.holder("acme", "ci", twin_prefix) is None
    assert tenants.holder("acme", "ci", "a" * 16) is not None  # the config's own token still holds
    assert tenants.holder("acme", "ci", "") is None  # no prefix, no match


@pytest.mark.anyio
async def test_a_session_holds_at_most_max_connections_and_gives_each_back() -> None:
    """`sandbox.preview.max_connections` open at once per session (429 past it, naming the key);
    a closed one, or one whose opening failed, gives its place back; other sessions are not held."""
    from types import SimpleNamespace

    from sandbox.preview.access import Openings, PreviewRefused

    closed: list[int] = []

    class Stream:
        async def aclose(self) -> None:
            closed.append(1)

    class Link:
        async def open_port(self, port: int) -> Stream:
            return Stream()

    class Box:
        id = "c1"

        async def agent_link(self) -> Link:
            return Link()

    def session(key: str, box: Box | None) -> Any:
        preview = SimpleNamespace(ports=[8000], max_connections=2, link_ttl_s=600)
        agent = SimpleNamespace(sandbox=SimpleNamespace(preview=preview), tenant="acme", key_path="agents.list[0]")

        async def running_sandbox() -> Box | None:
            return box

        return SimpleNamespace(key=key, agent=agent, sandboxed=True, running_sandbox=running_sandbox)

    openings = Openings()
    web = session("web", Box())
    async with openings.port(web, 8000), openings.port(web, 8000):
        with pytest.raises(PreviewRefused) as refused:
            async with openings.port(web, 8000):
                pass
        assert refused.value.status == 429 and "sandbox.preview.max_connections" in refused.value.message
        async with openings.port(session("other", Box()), 8000):  # another session: its own places
            pass
    async with openings.port(web, 8000):  # both given back
        pass
    with pytest.raises(PreviewRefused) as gone:
        async with openings.port(session("web", None), 8000):
            pass
    assert gone.value.status == 404
    assert len(closed) == 4 and not openings._open  # every opened stream closed, no place kept
