"""The approvals console in a real headless Chromium (the browser sandbox image, driven through
Playwright's connect_over_cdp; no browser is downloaded): an operator logs in, a call waiting
for approval appears by itself (the page's refresh), its arguments carry markup that must not
run, the approval made in the page lets the waiting call run, and every page renders. A
screenshot of each page is kept (the folder is printed; under $TMPDIR, never in the checkout).

Everything runs on a network this test makes: `sandbox serve` listens on the network's gateway
address (this host), the browser container reaches it there, and the test reaches the browser's
DevTools through a loopback-published port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.conftest import RUN_ID, TEST_LABEL
from tests.service_helpers import TOKEN_A, free_port, remove_instance, sha, wait_healthy

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

OPERATOR = "sbx_operator-token-of-the-browser-test"
INSTANCE = f"cui{RUN_ID}"
A = {"Authorization": f"Bearer {TOKEN_A}"}
SHOTS = Path(tempfile.gettempdir()) / "agent-sandbox-console-screens" / RUN_ID


@pytest.fixture
def network() -> Iterator[tuple[str, str]]:
    """A bridge network of this test: its name and its gateway (this host's address on it)."""
    client = docker.from_env()
    net = client.networks.create(f"sbx-{RUN_ID}-ui", driver="bridge", labels={TEST_LABEL: RUN_ID})
    try:
        net.reload()
        yield net.name, net.attrs["IPAM"]["Config"][0]["Gateway"]
    finally:
        remove_instance(INSTANCE)
        for box in client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={RUN_ID}", "network": net.name}):
            box.remove(force=True)
        net.remove()
        client.close()


@pytest.fixture
def chromium(network: tuple[str, str]) -> Iterator[str]:
    """A headless Chromium of the browser image on the test's network; yields its DevTools URL."""
    client = docker.from_env()
    box = client.containers.run(
        "sandbox-browser:latest",
        detach=True,
        name=f"sbx-{RUN_ID}-ui-browser",
        network=network[0],
        ports={"9222/tcp": ("127.0.0.1", None)},
        labels={TEST_LABEL: RUN_ID},
    )
    try:
        box.reload()
        port = box.attrs["NetworkSettings"]["Ports"]["9222/tcp"][0]["HostPort"]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/json/version", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, box.logs()[-2000:]
            time.sleep(0.2)
        yield url
    finally:
        box.remove(force=True)
        client.close()


@pytest.fixture
def service(tmp_path: Path, network: tuple[str, str]) -> Iterator[str]:
    """`sandbox serve` on the network's gateway address, sandboxed sessions, exec needs approval."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    cfg = tmp_path / "sandbox.yaml"
    cfg.write_text(f"""
state_dir: {tmp_path / "state"}
instance: {INSTANCE}
tools: {{profile: full, approvals: {{require: [exec], timeout_s: 120}}}}
service: {{operator_tokens: [{{name: ops, sha256: {sha(OPERATOR)}}}]}}
tenants: [{{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: rw, preview: {{ports: [8000]}}}}}}
  list: [{{id: alpha, tenant: acme, workspace: {ws}}}]
""")
    port = free_port()
    with (tmp_path / "serve.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "--config", str(cfg), "serve", "--host", network[1], "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://{network[1]}:{port}"
    try:
        wait_healthy(url, seconds=60, gone=lambda: None if proc.poll() is None else "exited")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_an_approval_made_in_the_browser_lets_the_waiting_call_run(chromium: str, service: str) -> None:
    from playwright.sync_api import sync_playwright

    answers: list[httpx.Response] = []
    markup = "<img src=x onerror=alert(1)>"

    def call() -> None:
        command = f"echo '{markup}' > /dev/null; echo ran-after-approval"
        answers.append(
            httpx.post(
                f"{service}/v1/sessions/agent:alpha:ui1/calls",
                headers=A,
                json={"tool": "exec", "args": {"command": command}},
                timeout=180,
            )
        )

    with sync_playwright() as p:
        browser = p.chromium.connect_over_cdp(chromium)
        try:
            context = browser.new_context()
            page = context.new_page()
            dialogs: list[str] = []

            def dialog(d: Any) -> None:
                dialogs.append(d.message)
                d.dismiss()

            page.on("dialog", dialog)
            page.goto(f"{service}/ui/login")
            _shot(page, "1-login")
            page.fill("#token", OPERATOR)
            page.click("#login-button")
            page.wait_for_url("**/ui/approvals")
            assert "No call is waiting" in page.inner_text("#approvals")
            waiting = threading.Thread(target=call)
            waiting.start()
            # the page was loaded before the call asked: its refresh must bring the approval
            page.wait_for_selector("section.approval", timeout=90_000)
            arguments = page.inner_text("section.approval pre.arguments")
            assert markup in arguments  # shown as text, exactly
            assert page.locator("section.approval img").count() == 0  # never as markup
            _shot(page, "2-approvals")
            page.fill("section.approval form[action$='/approve'] input[name=reason]", "looks fine")
            page.click("section.approval button.approve")
            page.wait_for_url("**/ui/approvals")
            waiting.join(timeout=120)
            assert answers and answers[0].status_code == 200, answers
            result = answers[0].json()
            assert result["ok"] is True and "ran-after-approval" in result["output"]["output"], result
            assert dialogs == []  # no script of the model's ever ran
            page.goto(f"{service}/ui/sessions")
            assert "agent:alpha:ui1" in page.inner_text("main")
            _shot(page, "3-sessions")
            page.click("text=agent:alpha:ui1")
            page.wait_for_url("**/ui/timeline**")
            timeline = page.inner_text("main")
            assert "exec" in timeline and "approved" in timeline, timeline[:2000]
            _shot(page, "4-timeline")
            page.goto(f"{service}/ui/sandboxes")
            sandboxes = page.inner_text("main")
            assert "/workspace" in sandboxes and "acme" in sandboxes, sandboxes[:2000]
            _shot(page, "5-sandboxes")
            page.goto(f"{service}/ui/egress")
            assert "Egress log" in page.inner_text("main")
            _shot(page, "6-egress")
            assert dialogs == []
        finally:
            browser.close()
    print(f"console screenshots: {SHOTS}")


# a page the sandbox serves, as an attacker writes it: it knows a pending approval's id (APPROVAL)
# and tries, from the operator's own browser, everything the service's origin would allow it
ATTACK_PAGE = """<!doctype html><title>attack</title><pre id=result>running</pre>
<form id=f method=post action="/ui/approvals/APPROVAL/approve" target=sink>
<input name=reason value=forged><input name=csrf value=guess></form><iframe name=sink></iframe>
<script>
const out = {};
function done() { document.getElementById("result").textContent = JSON.stringify(out); }
try { out.cookie = document.cookie; } catch (e) { out.cookie = "refused: " + e.name; }
try { localStorage.setItem("x", "1"); out.storage = "allowed"; } catch (e) { out.storage = "refused: " + e.name; }
out.origin = String(self.origin);
document.getElementById("f").submit();
fetch("/ui/approvals/APPROVAL", {credentials: "include"})
  .then(r => r.text()).then(t => { out.read = "read " + t.length; })
  .catch(e => { out.read = "refused: " + e.name; })
  .then(() => fetch("/ui/approvals/APPROVAL/approve", {method: "POST", mode: "no-cors", credentials: "include",
                     body: new URLSearchParams({reason: "forged", csrf: "guess"})}))
  .then(() => { out.post = "sent"; }, e => { out.post = "refused: " + e.name; })
  .then(done);
</script>"""


def _pending(service: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(f"{service}/v1/approvals", headers=A, timeout=30).json()
    return found


def _approve_next(service: str, seconds: float = 60) -> None:
    """Approve, over the tenant's API, the next call that asks (this test's own setup calls)."""
    deadline = time.monotonic() + seconds
    while not (pending := _pending(service)):
        assert time.monotonic() < deadline, "no call asked for approval"
        time.sleep(0.2)
    decided = httpx.post(f"{service}/v1/approvals/{pending[0]['id']}/approve", headers=A, timeout=30)
    assert decided.status_code == 200, decided.text


def test_a_preview_page_cannot_read_the_console_or_act_as_its_operator(chromium: str, service: str) -> None:
    """The operator is logged in to the console in this browser; a page a sandbox serves (through a
    preview link, on the service's own host and port) tries to read the console, approve a waiting
    call by a forged form and by fetch, and touch the service's cookies and storage. It is an
    opaque origin (CSP sandbox): every attempt fails and the call stays waiting."""
    from playwright.sync_api import sync_playwright

    key = "agent:alpha:pv1"

    def call(tool: str, args: dict[str, Any], into: list[httpx.Response]) -> threading.Thread:
        def run() -> None:
            into.append(
                httpx.post(
                    f"{service}/v1/sessions/{key}/calls", headers=A, json={"tool": tool, "args": args}, timeout=180
                )
            )

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    started: list[httpx.Response] = []
    server = call("exec", {"command": "python3 -m http.server 8000 --bind 127.0.0.1", "background": True}, started)
    _approve_next(service)
    server.join(timeout=120)
    assert started and started[0].json()["ok"], started
    victim: list[httpx.Response] = []
    waiting = call("exec", {"command": "echo the-forged-approval-ran"}, victim)
    deadline = time.monotonic() + 60
    while not (pending := _pending(service)):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    approval = pending[0]["id"]
    page_text = ATTACK_PAGE.replace("APPROVAL", approval)
    wrote = httpx.post(
        f"{service}/v1/sessions/{key}/calls", headers=A, timeout=60,
        json={"tool": "write", "args": {"path": "attack.html", "content": page_text}},
    )  # fmt: skip
    assert wrote.json()["ok"], wrote.text
    link = httpx.post(f"{service}/v1/sessions/{key}/preview-links", headers=A, json={"port": 8000}, timeout=30)
    assert link.status_code == 200, link.text

    with sync_playwright() as p:
        browser = p.chromium.connect_over_cdp(chromium)
        try:
            context = browser.new_context()
            page = context.new_page()
            page.goto(f"{service}/ui/login")
            page.fill("#token", OPERATOR)
            page.click("#login-button")
            page.wait_for_url("**/ui/approvals")
            page.wait_for_selector("section.approval", timeout=60_000)  # the operator sees the waiting call
            assert [c for c in context.cookies() if c["path"] == "/ui"]  # logged in: the cookie is in this browser
            page.goto(f"{service}{link.json()['url']}attack.html")
            page.wait_for_function("document.getElementById('result').textContent !== 'running'", timeout=30_000)
            result = json.loads(page.inner_text("#result"))
            _shot(page, "7-preview-attack")
            # still logged in, and the console still shows the call waiting
            page.goto(f"{service}/ui/approvals")
            page.wait_for_selector("section.approval", timeout=30_000)
        finally:
            browser.close()
    assert result["origin"] == "null", result  # an opaque origin, not the service's
    assert result["cookie"].startswith("refused") and result["storage"].startswith("refused"), result
    assert result["read"].startswith("refused"), result  # the console's page was never readable
    assert [a["id"] for a in _pending(service)] == [approval]  # neither the form nor the fetch approved it
    assert not victim  # the call still waits
    denied = httpx.post(f"{service}/v1/approvals/{approval}/deny", headers=A, timeout=30)
    assert denied.status_code == 200
    waiting.join(timeout=120)
    assert victim and victim[0].json()["ok"] is False and "the-forged-approval-ran" not in victim[0].text
