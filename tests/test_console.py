"""The approvals console (`/ui`) driven by a real HTTP client over loopback, as an attacker
would: only an operator's token opens it (a tenant's does not), every state change needs the
login's CSRF token and a same-site request, and what a model chose (a command, a session key)
is shown escaped, never as markup or terminal controls. Agents run in mode off (no
containers): the console's boundary is the service's. tests/test_console_browser_docker.py
drives it in a real browser."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.journal.store import Approval, Journal
from tests.service_helpers import TOKEN_A, serve, sha

pytestmark = pytest.mark.slow  # real servers in threads: seconds, kept out of the quick loop

OPERATOR = "sbx_operator-token-of-the-console"
A = {"Authorization": f"Bearer {TOKEN_A}"}


def _config(tmp: Path, operators: bool = True) -> Any:
    from sandbox.config import load_config_text

    service = f"service: {{operator_tokens: [{{name: ops, sha256: {sha(OPERATOR)}}}]}}\n" if operators else ""
    return load_config_text(f"""
state_dir: {tmp / "state"}
tools: {{profile: full, approvals: {{require: [exec], timeout_s: 60}}}}
{service}tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: alpha, tenant: acme, workspace: "{tmp / "wa"}"}}
""")


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("console")
    cfg = _config(tmp)
    with serve(cfg) as url:
        yield url, cfg


@contextmanager
def _login(url: str) -> Iterator[tuple[httpx.Client, str]]:
    """A client holding an operator's login, and the login's CSRF token (read from a page)."""
    with httpx.Client(base_url=url, timeout=30) as client:
        answer = client.post("/ui/login", headers={"Authorization": f"Bearer {OPERATOR}"})
        assert answer.status_code == 200 and answer.json() == {"operator": "ops"}, answer.text
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie, cookie
        page = client.get("/ui/approvals").text
        yield client, page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def _pending(cfg: Any, approval_id: str, session: str, arguments: dict[str, Any]) -> None:
    journal = Journal(cfg.state_dir / "journal.sqlite3")
    try:
        journal.add_approval(
            Approval(approval_id, "c", "t", session, "alpha", "exec", arguments, "pending", "", time.time(), None)
        )
    finally:
        journal.close()


def test_no_operator_tokens_no_console(tmp_path: Path) -> None:
    with serve(_config(tmp_path, operators=False)) as url:
        assert httpx.get(f"{url}/ui/approvals").status_code == 404
        assert httpx.post(f"{url}/ui/login", headers={"Authorization": f"Bearer {OPERATOR}"}).status_code == 404


def test_only_an_operators_token_opens_the_console(console: Any) -> None:
    url, _ = console
    assert httpx.get(f"{url}/ui/approvals").status_code == 303  # to the login page
    assert httpx.get(f"{url}/ui/approvals", headers=A).status_code == 303  # a tenant's bearer token is no login
    for header in (A, {}, {"Authorization": "Bearer sbx_guess"}, {"Authorization": f"Basic {OPERATOR}"}):
        refused = httpx.post(f"{url}/ui/login", headers=header)
        assert refused.status_code == 401 and "set-cookie" not in refused.headers, header
    forged = httpx.get(f"{url}/ui/approvals", cookies={"sbx_console": "made-up"})
    assert forged.status_code == 303
    with _login(url) as (client, _):
        page = client.get("/ui/approvals")
        assert page.status_code == 200 and "Pending approvals" in page.text


def test_every_page_has_a_strict_content_security_policy(console: Any) -> None:
    url, _ = console
    with _login(url) as (client, _):
        for path in ("/ui/login", "/ui/approvals", "/ui/sessions", "/ui/egress", "/ui/timeline?session=x"):
            answer = client.get(path)
            assert answer.status_code == 200, (path, answer.text[:300])
            csp = answer.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe" not in csp and "frame-ancestors 'none'" in csp, path
            assert answer.headers["x-frame-options"] == "DENY" and answer.headers["cache-control"] == "no-store"
            assert "<script>" not in answer.text and " on" + "click=" not in answer.text  # no inline script


def test_a_command_and_a_session_key_carrying_markup_and_controls_are_shown_escaped(console: Any) -> None:
    url, cfg = console
    evil = "<script>alert(1)</script>\x1b[2J\u202eexe.txt"
    session = 'agent:alpha:<img src=x onerror="alert(2)">'
    _pending(cfg, "ap-evil", session, {"command": evil})
    with _login(url) as (client, csrf):
        page = client.get("/ui/approvals").text
        assert "ap-evil" in page
        assert "<script>alert" not in page and "<img src=x" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x" in page
        assert "\x1b" not in page and "\u202e" not in page
        assert "\\u001b[2J" in page and "\\u202e" in page  # shown as escapes, as `approvals show` does
        client.post("/ui/approvals/ap-evil/deny", data={"csrf": csrf, "reason": "test"})


def test_a_forged_decision_is_refused_and_decides_nothing(console: Any) -> None:
    url, cfg = console
    _pending(cfg, "ap-forged", "agent:alpha:f", {"command": "rm -rf /"})
    with _login(url) as (client, csrf):
        no_token = client.post("/ui/approvals/ap-forged/approve", data={"reason": "x"})
        wrong = client.post("/ui/approvals/ap-forged/approve", data={"csrf": "nope", "reason": "x"})
        other_site = client.post(
            "/ui/approvals/ap-forged/approve", data={"csrf": csrf}, headers={"Origin": "http://evil.example"}
        )
        cross = client.post(
            "/ui/approvals/ap-forged/approve", data={"csrf": csrf}, headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert [r.status_code for r in (no_token, wrong, other_site, cross)] == [403, 403, 403, 403]
        without_login = httpx.post(f"{url}/ui/approvals/ap-forged/approve", data={"csrf": csrf})
        assert without_login.status_code in (303, 401)
        with_tenant_token = httpx.post(f"{url}/ui/approvals/ap-forged/approve", headers=A, data={"csrf": csrf})
        assert with_tenant_token.status_code in (303, 401)
        assert "ap-forged" in client.get("/ui/approvals").text  # still pending
        denied = client.post("/ui/approvals/ap-forged/deny", data={"csrf": csrf, "reason": "not today"})
        assert denied.status_code == 303
        again = client.post("/ui/approvals/ap-forged/approve", data={"csrf": csrf})
        assert again.status_code == 409  # decided once
    journal = Journal(cfg.state_dir / "journal.sqlite3")
    try:
        decided = journal.approval("ap-forged")
    finally:
        journal.close()
    assert decided is not None and decided.status == "denied" and "not today (operator ops)" in decided.reason


def test_an_approval_made_in_the_console_lets_the_waiting_call_run(console: Any) -> None:
    """A real call waits for its approval; the operator approves it through the console's form;
    the call runs and answers."""
    url, _ = console
    answers: list[httpx.Response] = []

    def call() -> None:
        answers.append(
            httpx.post(
                f"{url}/v1/sessions/agent:alpha:ui/calls",
                headers=A,
                json={"tool": "exec", "args": {"command": "echo approved-through-the-console"}},
                timeout=90,
            )
        )

    waiting = threading.Thread(target=call)
    waiting.start()
    with _login(url) as (client, csrf):
        approval_id = None
        deadline = time.monotonic() + 30
        while approval_id is None:
            assert time.monotonic() < deadline, "the call never asked for approval"
            listing = client.get("/ui/approvals/list").text
            if "agent:alpha:ui" in listing:
                approval_id = listing.split('data-approval="', 1)[1].split('"', 1)[0]
            time.sleep(0.1)
        assert client.post(f"/ui/approvals/{approval_id}/approve", data={"csrf": csrf}).status_code == 303
    waiting.join(timeout=60)
    assert answers and answers[0].status_code == 200
    result = answers[0].json()
    assert result["ok"] is True and "approved-through-the-console" in result["output"]["output"], result


def test_logout_needs_the_csrf_token_and_ends_the_login(console: Any) -> None:
    url, _ = console
    with _login(url) as (client, csrf):
        cookie = client.cookies["sbx_console"]
        assert client.post("/ui/logout", data={}).status_code == 403
        assert client.get("/ui/approvals").status_code == 200
        assert client.post("/ui/logout", data={"csrf": csrf}).status_code == 303
    # the old cookie, replayed, is no login any more (the server forgot it, not just the browser)
    replayed = httpx.get(f"{url}/ui/approvals", cookies={"sbx_console": cookie})
    assert replayed.status_code == 303


def test_an_operator_token_that_is_a_tenants_is_a_config_error(tmp_path: Path) -> None:
    from sandbox.config import load_config_text
    from sandbox.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config_text(f"""
state_dir: {tmp_path / "s"}
service: {{operator_tokens: [{{name: ops, sha256: {sha(TOKEN_A)}}}]}}
tenants: [{{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]
""")
    assert "service.operator_tokens[0].sha256" in str(caught.value) or "operator_tokens" in str(caught.value)


def test_sessions_show_sub_agents_under_the_session_that_spawned_them(console: Any) -> None:
    url, _ = console
    spawned = httpx.post(
        f"{url}/v1/sessions/agent:alpha:parent/calls",
        headers=A,
        json={"tool": "sessions_spawn", "args": {"name": "helper", "task": "count <b>lines</b>"}},
        timeout=60,
    )
    assert spawned.status_code == 200 and spawned.json()["ok"], spawned.text
    child = spawned.json()["output"]["session"]
    with _login(url) as (client, _):
        page = client.get("/ui/sessions").text
    parent_at, child_at = page.index("<code>agent:alpha:parent</code>"), page.index(f"<code>{child}</code>")
    assert parent_at < child_at and "<ul>" in page[parent_at:child_at]  # nested under its parent
    assert "count &lt;b&gt;lines&lt;/b&gt;" in page and "<b>lines" not in page


def test_the_operator_sees_the_arguments_exactly_as_they_will_run_never_masked(console: Any) -> None:
    """The journal masks what looks like a secret when it shows an approval to anyone else; the
    operator who decides must see what will run (a masked `AUTH=...` could hide the payload)."""
    url, cfg = console
    _pending(cfg, "ap-masked", "agent:alpha:m", {"command": 'AUTH="echo HIDDEN-PAYLOAD"; eval "$AUTH"'})
    with _login(url) as (client, csrf):
        page = client.get("/ui/approvals").text
        assert "HIDDEN-PAYLOAD" in page
        client.post("/ui/approvals/ap-masked/deny", data={"csrf": csrf})


def test_long_arguments_are_cut_in_the_list_and_whole_on_their_own_page(console: Any) -> None:
    url, cfg = console
    command = "echo " + "x" * 40_000 + " THE-END"
    _pending(cfg, "ap-long", "agent:alpha:l", {"command": command})
    with _login(url) as (client, csrf):
        listing = client.get("/ui/approvals").text
        assert "THE-END" not in listing and "more characters" in listing and "/ui/approvals/ap-long" in listing
        whole = client.get("/ui/approvals/ap-long")
        assert whole.status_code == 200 and "THE-END" in whole.text
        assert client.get("/ui/approvals/nope").status_code == 404
        client.post("/ui/approvals/ap-long/deny", data={"csrf": csrf})


def test_a_metrics_token_opens_no_console_and_the_cdn_docs_pages_are_off(tmp_path: Path) -> None:
    """A scraper's token is no operator's; with the console on, FastAPI's /docs and /redoc (which
    load scripts from a CDN into the console's origin) are not served."""
    from sandbox.config import load_config_text

    cfg = load_config_text(f"""
state_dir: {tmp_path / "s"}
service:
  operator_tokens: [{{name: ops, sha256: {sha(OPERATOR)}}}]
  metrics_tokens: [{{name: prom, sha256: {sha("sbx_metrics-token")}}}]
tenants: [{{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]
agents: {{list: [{{id: alpha, tenant: acme, workspace: "{tmp_path / "w"}"}}]}}
""")
    with serve(cfg) as url:
        assert httpx.post(f"{url}/ui/login", headers={"Authorization": "Bearer sbx_metrics-token"}).status_code == 401
        assert httpx.get(f"{url}/docs").status_code == 404 and httpx.get(f"{url}/redoc").status_code == 404
        assert httpx.get(f"{url}/openapi.json").status_code == 200


def test_the_cookie_is_secure_behind_a_tls_proxy_and_the_operator_name_survives_a_long_reason(console: Any) -> None:
    url, cfg = console
    answer = httpx.post(
        f"{url}/ui/login", headers={"Authorization": f"Bearer {OPERATOR}", "X-Forwarded-Proto": "https"}
    )
    assert "Secure" in answer.headers["set-cookie"]
    _pending(cfg, "ap-reason", "agent:alpha:r", {"command": "true"})
    with _login(url) as (client, csrf):
        client.post("/ui/approvals/ap-reason/deny", data={"csrf": csrf, "reason": "x" * 5000})
    journal = Journal(cfg.state_dir / "journal.sqlite3")
    try:
        decided = journal.approval("ap-reason")
    finally:
        journal.close()
    assert decided is not None and decided.reason.endswith("(operator ops)") and len(decided.reason) <= 1000


def test_megabytes_of_arguments_or_event_data_cost_the_page_only_what_it_shows(console: Any) -> None:
    """A tenant's real call with a 2 MB command waits for approval: the list shows 16 KiB of it
    and says how much more; the session's timeline shows each event's data cut (the journal
    reads at most a few KiB of it)."""
    url, _ = console
    answers: list[httpx.Response] = []
    command = "echo " + "y" * 2_000_000

    def call() -> None:
        body = {"tool": "exec", "args": {"command": command}}
        answers.append(httpx.post(f"{url}/v1/sessions/agent:alpha:huge/calls", headers=A, json=body, timeout=120))

    waiting = threading.Thread(target=call)
    waiting.start()
    with _login(url) as (client, csrf):
        deadline = time.monotonic() + 60
        while "agent:alpha:huge" not in (listing := client.get("/ui/approvals/list")).text:
            assert time.monotonic() < deadline, "the call never asked for approval"
            time.sleep(0.2)
        assert len(listing.content) < 200_000 and "more characters" in listing.text
        approval_id = listing.text.split('data-approval="', 1)[1].split('"', 1)[0]
        assert client.post(f"/ui/approvals/{approval_id}/deny", data={"csrf": csrf}).status_code == 303
        waiting.join(timeout=60)
        assert answers and answers[0].json()["error"]["code"] == "APPROVAL_DENIED"
        timeline = client.get("/ui/timeline", params={"session": "agent:alpha:huge"})
        assert timeline.status_code == 200 and "proposed" in timeline.text and len(timeline.content) < 200_000
