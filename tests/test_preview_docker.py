"""Preview URLs against the real engine (issue 30, part 4): a session starts a web server inside
its sandbox, which has no network at all, and the service shows it, through the resident agent,
with the tenant's token or a signed link: HTTP both ways, a large body, a websocket. As attacks:
what the sandbox must never see (the tenant's token, the browser's cookies), what the browser
must never get from it (a cookie for the service's host, a page on the service's origin), ports
not listed, another tenant, an altered or expired link, a link of a closed session, a session
reaching another session's server in a shared sandbox."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.service_helpers import TOKEN_A, TOKEN_B, serve, sha
from tests.test_service_docker import call as service_call

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}
SERVER = (Path(__file__).parent / "data" / "preview_server.py").read_text()
PORT, SILENT_PORT = 8000, 8001


def config(make_config: Any, scope: str = "session", extra: str = "") -> Any:
    return make_config(f"""
tenants:
  - {{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
agents:
  defaults:
    sandbox:
      mode: all
      scope: {scope}
      preview: {{ports: [{PORT}, {SILENT_PORT}], link_ttl_s: 600}}
      {extra}
  list:
    - {{id: alpha, tenant: acme, default: true}}
    - {{id: beta, tenant: globex}}
""")


def call(url: str, headers: dict[str, str], key: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    body = service_call(url, headers, key, tool, args)
    assert body["ok"], body
    return body


def start_server(url: str, headers: dict[str, str], key: str, port: int = PORT) -> None:
    """The session writes the server into its sandbox and starts it in the background."""
    call(url, headers, key, "write", {"path": "preview_server.py", "content": SERVER})
    call(url, headers, key, "exec", {"command": f"python3 preview_server.py {port}", "background": True})
    wait = f"for i in $(seq 50); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
    call(url, headers, key, "exec", {"command": wait})


@pytest.fixture
def served(make_config: Any) -> Iterator[str]:
    with serve(config(make_config)) as url:
        yield url


def test_a_server_in_a_sandbox_without_network_is_shown_with_the_tenants_token(
    served: str, docker_client: Any, instance: str
) -> None:
    url = served
    start_server(url, A, "web")
    [box] = [c for c in docker_client.containers.list(filters={"label": f"io.agent-sandbox.instance={instance}"})]
    assert box.attrs["HostConfig"]["NetworkMode"] == "none"  # the sandbox has no network at all

    page = httpx.get(f"{url}/v1/sessions/web/ports/{PORT}/", headers={**A, "Cookie": "theirs=1"}, timeout=30)
    assert page.status_code == 200 and b"preview ok" in page.content
    assert page.headers["x-app"] == "1"  # the app's own headers come through
    # ...but never a cookie for the service's host, and the page is an opaque origin
    assert "set-cookie" not in page.headers
    assert page.headers["content-security-policy"].startswith("sandbox ")
    assert "allow-same-origin" not in page.headers["content-security-policy"]
    assert page.headers["referrer-policy"] == "no-referrer"

    echoed = httpx.get(f"{url}/v1/sessions/web/ports/{PORT}/echo?x=1%2F2", headers={**A, "Cookie": "c=1"}, timeout=30)
    seen = echoed.json()
    assert seen["path"] == "/echo?x=1%2F2"  # the path and query as the browser sent them
    assert "authorization" not in seen["headers"] and "cookie" not in seen["headers"]  # never the sandbox's
    assert seen["headers"]["host"] == f"localhost:{PORT}"
    assert seen["headers"]["x-forwarded-prefix"] == f"/v1/sessions/web/ports/{PORT}"

    body = os.urandom(3 << 20)  # past the agent's window many times
    posted = httpx.post(f"{url}/v1/sessions/web/ports/{PORT}/upload", headers=A, content=body, timeout=60)
    assert posted.status_code == 201
    assert posted.json() == {"length": len(body), "sha256": hashlib.sha256(body).hexdigest(), "path": "/upload"}
    big = httpx.get(f"{url}/v1/sessions/web/ports/{PORT}/big?n={5 << 20}", headers=A, timeout=60)
    assert big.status_code == 200 and len(big.content) == 5 << 20
    assert big.content == (b"0123456789abcdef" * (5 << 16))[: 5 << 20]

    head = httpx.head(f"{url}/v1/sessions/web/ports/{PORT}/", headers=A, timeout=30)
    assert head.status_code == 200 and head.content == b""

    redirect = httpx.get(f"{url}/v1/sessions/web/ports/{PORT}", headers=A, timeout=30)
    assert redirect.status_code == 308 and redirect.headers["location"].endswith(f"/ports/{PORT}/")

    ws_url = url.replace("http://", "ws://") + f"/v1/sessions/web/ports/{PORT}/ws"
    with connect(ws_url, additional_headers=A, open_timeout=30) as ws:
        assert ws.recv(timeout=30) == "hello"  # what the server said with its handshake answer
        for text in ("hello", "x" * 70000):
            ws.send(text)
            assert ws.recv(timeout=30) == "echo:" + text
    httpx.delete(f"{url}/v1/sessions/web", headers=A, timeout=120)


def test_ports_not_listed_nothing_listening_and_other_tenants_are_refused(served: str) -> None:
    url = served
    start_server(url, A, "web")
    not_listed = httpx.get(f"{url}/v1/sessions/web/ports/22/", headers=A, timeout=30)
    assert not_listed.status_code == 403 and "sandbox.preview.ports" in not_listed.json()["detail"]
    silent = httpx.get(f"{url}/v1/sessions/web/ports/{SILENT_PORT}/", headers=A, timeout=30)
    assert silent.status_code == 502 and "nothing listens" in silent.json()["detail"]
    # globex names acme's session key: its own session of that key, which has no sandbox
    other = httpx.get(f"{url}/v1/sessions/web/ports/{PORT}/", headers=B, timeout=30)
    assert other.status_code == 404 and "preview ok" not in other.text
    stranger = httpx.get(f"{url}/v1/sessions/web/ports/{PORT}/", timeout=30)
    assert stranger.status_code == 401
    no_sandbox = httpx.post(f"{url}/v1/sessions/fresh/preview-links", headers=A, json={"port": PORT}, timeout=30)
    assert no_sandbox.status_code == 404 and "no running sandbox" in no_sandbox.json()["detail"]
    # a websocket without a token is refused before anything reaches the sandbox
    ws_url = url.replace("http://", "ws://") + f"/v1/sessions/web/ports/{PORT}/ws"
    with pytest.raises(InvalidStatus) as refused_ws, connect(ws_url, open_timeout=10):
        pass
    assert refused_ws.value.response.status_code == 403
    httpx.delete(f"{url}/v1/sessions/web", headers=A, timeout=120)


def test_a_signed_link_opens_the_port_until_it_expires_or_the_session_closes(served: str) -> None:
    url = served
    start_server(url, A, "web")
    too_long = httpx.post(f"{url}/v1/sessions/web/preview-links", headers=A, json={"port": PORT, "ttl_s": 601})
    assert too_long.status_code == 400 and "link_ttl_s" in too_long.json()["detail"]
    not_listed = httpx.post(f"{url}/v1/sessions/web/preview-links", headers=A, json={"port": 22})
    assert not_listed.status_code == 403

    made = httpx.post(f"{url}/v1/sessions/web/preview-links", headers=A, json={"port": PORT}, timeout=30)
    assert made.status_code == 200, made.text
    link = made.json()
    assert link["port"] == PORT and link["url"].startswith("/v1/previews/") and link["url"].endswith("/")
    page = httpx.get(url + link["url"], timeout=30)  # no token: the link is the credential
    assert page.status_code == 200 and b"preview ok" in page.content
    assert "set-cookie" not in page.headers and page.headers["content-security-policy"].startswith("sandbox ")
    relative = httpx.get(url + link["url"] + "echo", timeout=30)  # what the page's <a href='echo'> opens
    assert relative.status_code == 200 and relative.json()["path"] == "/echo"
    ws_url = url.replace("http://", "ws://") + link["url"] + "ws"
    with connect(ws_url, open_timeout=30) as ws:
        assert ws.recv(timeout=30) == "hello"
        ws.send("through the link")
        assert ws.recv(timeout=30) == "echo:through the link"

    token = link["url"].split("/")[3]
    head, payload, mac = token.split(".")
    forged_payload = json.loads(_unb64(payload)) | {"port": SILENT_PORT}
    for bad in (
        f"{head}.{payload}.{mac[:-2]}AA",  # an altered signature
        f"{head}.{_b64(json.dumps(forged_payload).encode())}.{mac}",  # another port, same signature
        "v1.e30.AAAA",
    ):
        refused = httpx.get(f"{url}/v1/previews/{bad}/", timeout=30)
        assert refused.status_code == 401 and "preview ok" not in refused.text

    short = httpx.post(f"{url}/v1/sessions/web/preview-links", headers=A, json={"port": PORT, "ttl_s": 1}).json()
    time.sleep(2.1)
    expired = httpx.get(url + short["url"], timeout=30)
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]

    logs = httpx.get(f"{url}/v1/logs", headers=A, params={"session": "agent:alpha:web", "tool": "preview"}).json()
    assert any(e["data"].get("port") == PORT for e in logs), logs  # each link made is journaled
    assert all(token not in json.dumps(e) for e in logs)  # never its text

    closed = httpx.delete(f"{url}/v1/sessions/web", headers=A, timeout=120)
    assert closed.status_code == 200
    after = httpx.get(url + link["url"], timeout=30)
    assert after.status_code in (404, 410) and "preview ok" not in after.text
    # the same key opened again (a new sandbox, the same server): the old link stays dead
    start_server(url, A, "web")
    again = httpx.get(url + link["url"], timeout=30)
    assert again.status_code == 410 and "preview ok" not in again.text
    httpx.delete(f"{url}/v1/sessions/web", headers=A, timeout=120)


def test_a_session_cannot_preview_another_sessions_server_in_a_shared_sandbox(make_config: Any) -> None:
    """Two sessions in one agent-scope container, each with a uid of its own: Bob's preview of
    the port Alice's server holds is refused; Alice's own works; an agent-scope link of Alice's
    dies when her session closes, though the container stays."""
    with serve(config(make_config, scope="agent")) as url:
        start_server(url, A, "alice")
        call(url, A, "bob", "exec", {"command": "true"})  # Bob's session, in the same container
        mine = httpx.get(f"{url}/v1/sessions/alice/ports/{PORT}/", headers=A, timeout=30)
        assert mine.status_code == 200 and b"preview ok" in mine.content
        theirs = httpx.get(f"{url}/v1/sessions/bob/ports/{PORT}/", headers=A, timeout=30)
        assert theirs.status_code == 502 and "this session's user" in theirs.json()["detail"]
        assert "preview ok" not in theirs.text
        link = httpx.post(f"{url}/v1/sessions/alice/preview-links", headers=A, json={"port": PORT}).json()
        assert httpx.get(url + link["url"], timeout=30).status_code == 200
        assert httpx.delete(f"{url}/v1/sessions/alice", headers=A, timeout=120).status_code == 200
        after = httpx.get(url + link["url"], timeout=30)
        assert after.status_code == 410 and "closed" in after.json()["detail"]
        httpx.delete(f"{url}/v1/sessions/bob", headers=A, timeout=120)


def test_a_preview_never_starts_restarts_or_replaces_a_sandbox(
    make_config: Any, docker_client: Any, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link holder (no token) or the tenant asking for a stopped session's port gets a 404,
    and the container stays as it is: stopped, not started again or replaced by a new one."""
    from sandbox.runtime import manager

    monkeypatch.setattr(manager, "REVALIDATE_AFTER_S", 0.0)  # every lookup asks the engine
    with serve(config(make_config)) as url:
        start_server(url, A, "web")
        link = httpx.post(f"{url}/v1/sessions/web/preview-links", headers=A, json={"port": PORT}, timeout=30).json()
        assert httpx.get(url + link["url"], timeout=30).status_code == 200
        [box] = docker_client.containers.list(filters={"label": f"io.agent-sandbox.instance={instance}"})
        box.stop(timeout=1)
        for attempt in (url + link["url"], f"{url}/v1/sessions/web/ports/{PORT}/"):
            answer = httpx.get(attempt, headers=A, timeout=60)
            assert answer.status_code == 404 and "no running sandbox" in answer.json()["detail"]
        made = httpx.post(f"{url}/v1/sessions/web/preview-links", headers=A, json={"port": PORT}, timeout=30)
        assert made.status_code == 404
        found = docker_client.containers.list(all=True, filters={"label": f"io.agent-sandbox.instance={instance}"})
        assert [(c.id, c.status) for c in found] == [(box.id, "exited")]
        httpx.delete(f"{url}/v1/sessions/web", headers=A, timeout=120)


def test_the_typed_clients_make_links_and_explain_shows_the_ports(served: str) -> None:
    from sandbox.client import AsyncClient, Client, ServiceError

    url = served
    start_server(url, A, "web")
    with Client(url, TOKEN_A) as client:
        session = client.session("web")
        link = session.preview_link(PORT, ttl_s=120)
        assert link.url.startswith(f"{url}/v1/previews/") and link.port == PORT
        assert b"preview ok" in httpx.get(link.url, timeout=30).content
        explained = session.explain()
        assert explained.preview is not None and explained.preview.ports == [PORT, SILENT_PORT]
        with pytest.raises(ServiceError) as refused:
            session.preview_link(22)
        assert refused.value.status == 403

    async def through_async() -> str:
        async with AsyncClient(url, TOKEN_A) as aclient:
            return (await aclient.session("web").preview_link(PORT)).url

    import anyio

    assert b"preview ok" in httpx.get(anyio.run(through_async), timeout=30).content
    httpx.delete(f"{url}/v1/sessions/web", headers=A, timeout=120)


def _b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
