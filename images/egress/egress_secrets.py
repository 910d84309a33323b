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


def substitute(host: str, headers: Any) -> list[str]:
    """Put the secrets of `host` into a request's headers; the names of those used.

    In a request to one of a secret's hosts, its placeholder is replaced wherever it occurs in a
    header value, and its header is set (format applied) when the request does not carry it. A
    request to any other host is left as it is, placeholder and all.
    """
    used = []
    name = normal_host(host)
    for secret in SECRETS:
        if not host_allowed(name, secret["hosts"]):
            continue
        placeholder, value = secret["placeholder"], secret["value"]
        hit = False
        for key in list(headers.keys()):
            values = headers.get_all(key)
            if any(placeholder in v for v in values):
                headers.set_all(key, [v.replace(placeholder, value) for v in values])
                hit = True
        if secret["header"] not in headers:
            headers[secret["header"]] = secret["format"].replace("{}", value, 1)
            hit = True
        if hit:
            used.append(secret["name"])
    return used


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
