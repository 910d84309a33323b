"""A secret's host that hands the value back, as attacks against the real proxy image.

The lab's web server answers `/leak?how=...` with the secret it was sent (the proxy injects it) in
the reason phrase, a header's name or value, a trailer, the body (whole, 8 characters of it, in
base64, base64url, hex, percent-encoding, gzip) or behind `Content-Encoding: utf-8`. Whatever
reaches the sandbox is searched with the proxy's own finder and must hold no form of the value;
each answer is either the response with the placeholder in the value's place, or a refusal, and
each has its journal line. Inside the decrypted tunnel, requests naming another host (a second
Host header, or another Host after the upstream connection closed) never reach a server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from tests.egress_lab import Lab, egress_config
from tests.test_egress_scrub import scrub

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]
VALUE = "s3cr3t-value-0123456789"
# (how, whether the answer passes with the placeholder in the value's place; None: either)
LEAKS: list[tuple[str, bool | None]] = [
    ("header", True),
    ("reason", True),
    ("gzip", True),
    ("header-b64", False),
    ("header-part", False),
    ("header-name", True),
    ("body-b64", False),
    ("body-b64url", False),
    ("body-hex", False),
    ("body-percent", False),
    ("body-part", False),
    ("utf8", False),
    ("gzip-b64", False),
    # mitmproxy 8 reads no HTTP/1 trailers: the response fails there (502), the value goes nowhere
    ("trailer", None),
]


def _config(make_config: Any, lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("SBX_TEST_EGRESS_SECRET", VALUE)
    upstream_ca = tmp_path / "upstream-ca.pem"
    upstream_ca.write_text(lab.web_cert)
    return egress_config(
        make_config,
        lab,
        allow=["allowed.test", "api.test"],
        upstream_ca=str(upstream_ca),
        secrets={"API_TOKEN": {"value_from": "env:SBX_TEST_EGRESS_SECRET", "hosts": ["api.test"]}},
    )


async def _sh(session: Any, command: str) -> str:
    result = await session.call("exec", {"command": command, "timeout_s": 30})
    assert result.error is None, result.error
    return str(result.output["output"])


async def test_nothing_of_the_value_reaches_the_sandbox(
    make_config: Any, lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every way the lab server hands the value back: the sandbox gets the placeholder or a refusal."""
    forms = scrub.forms(VALUE)
    async with Orchestrator(_config(make_config, lab, tmp_path, monkeypatch)) as orch:
        session = orch.session(agent="main", key="s-leak")
        placeholder = (await _sh(session, "printenv API_TOKEN")).strip()
        seen = {}
        for how, _ in LEAKS:
            out = await _sh(session, f"curl -sS -m 10 --raw -D - 'https://api.test:8443/leak?how={how}'; echo")
            seen[how] = out
            assert VALUE not in out and scrub.leak(forms, out.encode()) is None, (how, out)
        events = orch.journal.events(session=session.key)
        await session.close()
    for how, passes in LEAKS:
        status = [line for line in seen[how].splitlines() if line.startswith("HTTP/")][-1]  # after CONNECT's
        if passes:
            assert " 200" in status, (how, seen[how])
        elif passes is False:
            assert " 502" in status and "egress refused" in seen[how], (how, seen[how])
    assert f"X-Leak: {placeholder}" in seen["header"]
    assert f"200 OK {placeholder}" in seen["reason"]
    assert f"gz {placeholder}" in seen["gzip"]  # decoded, cleaned, sent plain
    assert "cannot be checked for secrets" in seen["utf8"]
    lines = [e.data for e in events if e.stage == "egress" and e.data.get("host") == "api.test"]
    refused = [line["reason"] for line in lines if line["verdict"] == "refused"]
    # one line for every refusal (the utf-8 one included: it used to be lost with the scrub)
    assert len(refused) == sum(passes is False for _, passes in LEAKS), refused
    assert any("Content-Encoding 'utf-8'" in r for r in refused), refused
    assert any("in base64 of secret API_TOKEN" in r for r in refused), refused
    assert any("part of the value" in r for r in refused), refused
    assert all(VALUE not in json.dumps(e.data) for e in events)


# inside the decrypted tunnel to api.test: requests whose Host names another host
HOST_CLIENT = r"""
import os, re, socket, ssl, sys
mode = sys.argv[1]
host, port = os.environ["HTTPS_PROXY"].split("//")[1].split(":")
s = socket.create_connection((host, int(port)), timeout=15)
s.sendall(b"CONNECT api.test:8443 HTTP/1.1\r\nHost: api.test:8443\r\n\r\n")
print("connect:", s.recv(200).split(b"\r\n")[0].decode())
t = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]).wrap_socket(s, server_hostname="api.test")
def ask(hosts, path):
    t.sendall(b"GET " + path + b" HTTP/1.1\r\n" + b"".join(b"Host: " + h + b"\r\n" for h in hosts) + b"\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = t.recv(4096)
        if not chunk:
            return "closed"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    while length and len(rest) < int(length.group(1)):
        rest += t.recv(4096)
    return (head.split(b"\r\n")[0] + b" | " + rest[:120]).decode(errors="replace")
try:
    if mode == "dup":
        print("answer:", ask([b"api.test:8443", b"allowed.test:8443"], b"/host-dup"))
    elif mode == "other":
        print("answer:", ask([b"allowed.test:8443"], b"/host-other"))
    elif mode == "absolute":  # a plain-HTTP URL for another host, sent inside the tunnel
        print("answer:", ask([b"allowed.test:8000"], b"http://allowed.test:8000/host-abs"))
    else:
        print("first:", ask([b"api.test:8443"], b"/keep"))
        print("answer:", ask([b"allowed.test:8443"], b"/host-second"))
except OSError as exc:
    print("answer: closed", type(exc).__name__)
"""


async def test_the_host_inside_the_decrypted_tunnel_is_the_tunnels(
    make_config: Any, lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second Host header, another Host, another Host after the upstream connection closed, and
    an absolute http:// URL for another host: refused, and the server never sees them."""
    async with Orchestrator(_config(make_config, lab, tmp_path, monkeypatch)) as orch:
        session = orch.session(agent="main", key="s-host")
        script = HOST_CLIENT.replace("'", "'\\''")
        answers = {}
        for mode in ("dup", "other", "second", "absolute"):
            answers[mode] = await _sh(session, f"python3 -c '{script}' {mode}")
        await session.close()
    for mode, out in answers.items():
        assert "connect: HTTP/1.1 200" in out, (mode, out)
        answer = out.split("answer:", 1)[1]
        assert " 200 " not in answer.split("|")[0] and "hello from" not in answer, (mode, out)
    assert "first: HTTP/1.1 200 OK | kept" in answers["second"], answers["second"]
    heard = lab.web.logs().decode()
    assert "HTTP /keep api.test:8443" in heard  # the tunnel works
    for path in ("/host-dup", "/host-other", "/host-second", "/host-abs"):
        assert path not in heard, (path, heard[-2000:])
