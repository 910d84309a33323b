"""The approvals console in a real headless Chromium (the browser sandbox image, driven through
Playwright's connect_over_cdp; no browser is downloaded): an operator logs in, a call waiting
for approval appears by itself (the page's refresh), its arguments carry markup that must not
run, the approval made in the page lets the waiting call run, and every page renders. A
screenshot of each page is kept (the folder is printed; under $TMPDIR, never in the checkout).

Everything runs on a network this test makes: `sandbox serve` listens on the network's gateway
address (this host), the browser container reaches it there, and the test reaches the browser's
DevTools through a loopback-published port."""

from __future__ import annotations

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
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: rw}}}}
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
