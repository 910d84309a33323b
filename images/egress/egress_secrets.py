"""Secrets that never enter the sandbox: the sandbox holds a placeholder, the proxy puts the real
value into requests to the secret's hosts only, over TLS it intercepts for those hosts alone.

Which CA the sandbox trusts for that interception is this proxy's own (generated at its start,
one per proxy): printed once, on the ready line, for the orchestrator to hand to its sandbox.
"""

from __future__ import annotations

import os
from typing import Any

from egress_rules import host_allowed, normal_host
from egress_state import POLICY

SECRETS: list[dict[str, Any]] = list(POLICY.get("secrets", []))
CA_CERT = "/tmp/mitmproxy/mitmproxy-ca-cert.pem"  # written by mitmproxy under its confdir
UPSTREAM_BUNDLE = "/tmp/upstream-ca.pem"
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def intercepted(host: str) -> bool:
    """Whether tunnels to `host` are decrypted here (it carries a secret); every other tunnel is not."""
    return any(host_allowed(host, s["hosts"]) for s in SECRETS)


def misplaced(host: str, request: Any) -> str | None:
    """Why a request to a secret's host must not go: a placeholder anywhere but in its own header
    (an echoing header, the URL, the body would hand the value back), or TRACE (which echoes all)."""
    name = normal_host(host)
    for secret in SECRETS:
        if not host_allowed(name, secret["hosts"]):
            continue
        if request.method.upper() == "TRACE":
            return f"TRACE is not sent to {name}, a host that carries a secret (it echoes the request)"
        placeholder = secret["placeholder"]
        for key, value in request.headers.items(multi=True):
            if placeholder in value and key.lower() != secret["header"].lower():
                return f"the placeholder of {secret['name']} may only be sent in its header {secret['header']}"
        if placeholder in request.url or placeholder.encode() in (request.raw_content or b""):
            return f"the placeholder of {secret['name']} may only be sent in its header {secret['header']}"
    return None


def substitute(host: str, headers: Any) -> list[str]:
    """Put the secrets of `host` into a request's headers; the names of those used.

    In a request to one of a secret's hosts, its placeholder is replaced in the secret's own header
    (and nowhere else: see `misplaced`), and that header is set (format applied) when the request
    does not carry it. A request to any other host is left as it is, placeholder and all.
    """
    used = []
    name = normal_host(host)
    for secret in SECRETS:
        if not host_allowed(name, secret["hosts"]):
            continue
        header, placeholder, value = secret["header"], secret["placeholder"], secret["value"]
        if header in headers:
            headers.set_all(header, [v.replace(placeholder, value) for v in headers.get_all(header)])
        else:
            headers[header] = secret["format"].replace("{}", value, 1)
        used.append(secret["name"])
    return used


def scrub(host: str, response: Any) -> bool:
    """Take a secret's value out of a response from its host before the sandbox sees it (a server
    that echoes a header); whether one was found."""
    name = normal_host(host)
    found = False
    for secret in SECRETS:
        if not host_allowed(name, secret["hosts"]):
            continue
        value, placeholder = secret["value"], secret["placeholder"]
        for key in list(response.headers.keys()):
            values = response.headers.get_all(key)
            if any(value in v for v in values):
                response.headers.set_all(key, [v.replace(value, placeholder) for v in values])
                found = True
        content = response.get_content(strict=False) or b""
        if value.encode() in content:
            response.set_content(content.replace(value.encode(), placeholder.encode()))
            found = True
    return found


def upstream_bundle() -> str | None:
    """The CAs the proxy trusts upstream: the system's plus `egress.upstream_ca` (an internal CA)."""
    extra = POLICY.get("upstream_ca_pem") or ""
    if not extra:
        return None
    with open(SYSTEM_BUNDLE, encoding="ascii", errors="replace") as system:
        bundle = system.read()
    with open(UPSTREAM_BUNDLE, "w", encoding="ascii") as out:
        out.write(bundle.rstrip("\n") + "\n" + extra.strip() + "\n")
    return UPSTREAM_BUNDLE


def ca_pem() -> str:
    """This proxy's CA certificate (public), or "" when mitmproxy made none."""
    if not os.path.exists(CA_CERT):
        return ""
    with open(CA_CERT, encoding="ascii") as handle:
        return handle.read()
