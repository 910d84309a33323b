"""Secrets that never enter the sandbox: the sandbox holds a placeholder, the proxy puts the real
value into requests to the secret's hosts only, over TLS it intercepts for those hosts alone.

Which CA the sandbox trusts for that interception is this proxy's own (generated at its start,
one per proxy): printed once, on the ready line, for the orchestrator to hand to its sandbox.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from egress_rules import host_allowed, normal_host
from egress_scrub import Form, forms, leak
from egress_state import POLICY
from mitmproxy import http
from mitmproxy.net import encoding

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


# the codings a response from a secret's host may come in: decoded here, checked, sent on plain
CODINGS = ("gzip", "deflate", "br", "zstd")


class Refused(Exception):
    """The response must not reach the sandbox (the message says why, never the value)."""


def carries_secret(host: str) -> bool:
    """Whether responses from `host` are checked for a secret's value (it is one of a secret's hosts)."""
    return intercepted(host)


@functools.cache
def _forms(value: str) -> list[Form]:
    return forms(value)


def _plain_body(response: Any) -> tuple[bytes, bool]:
    """The body as the sandbox would read it, and whether it was encoded (decoded here).

    Raises:
        Refused: a coding that cannot be checked (unknown, or not decodable).
    """
    raw = response.raw_content or b""
    listed = response.headers.get_all("content-encoding")
    codings = [c.strip().lower() for header in listed for c in header.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    body = raw
    for coding in reversed(codings):
        if coding not in CODINGS:
            raise Refused(f"a response in Content-Encoding {coding[:40]!r} cannot be checked for secrets")
        try:
            decoded = encoding.decode(body, coding)
        except ValueError as exc:
            raise Refused(
                f"a response in Content-Encoding {coding} does not decode ({exc.__class__.__name__})"
            ) from None
        if not isinstance(decoded, bytes):
            raise Refused(f"a response in Content-Encoding {coding} does not decode to bytes")
        body = decoded
    return body, bool(codings)


class _Cleaner:
    """One secret's check of each part of a response: the value goes back as its placeholder,
    anything else of it refuses."""

    def __init__(self, secret: dict[str, Any], host: str) -> None:
        self.value, self.placeholder = secret["value"].encode(), secret["placeholder"].encode()
        self.forms = _forms(secret["value"])
        self.name, self.host = secret["name"], host
        self.found = False

    def clean(self, data: bytes, where: str) -> bytes:
        if self.value in data:
            self.found = True
            data = data.replace(self.value, self.placeholder)
        kind = leak(self.forms, data)
        if kind is not None:
            raise Refused(f"{where} of the response from {self.host} carried {kind} of secret {self.name}")
        return data


def scrub(host: str, response: Any) -> bool:
    """Take every secret of `host` out of a response before the sandbox sees it: the value, whole,
    goes back as its placeholder (a server that echoes a header); whether one was.

    The reason phrase, every header (name and value), the trailers and the body (decoded) are
    checked. Part of the value (8 characters in a row) or the value encoded (base64, base64url,
    hex, percent-encoding) anywhere refuses the response.

    Raises:
        Refused: the response carries part of a value, or cannot be checked.
        TooManyHits: the check could not finish (the caller refuses).
    """
    name = normal_host(host)
    mine = [secret for secret in SECRETS if host_allowed(name, secret["hosts"])]
    if not mine:
        return False
    body, encoded = _plain_body(response)
    reason = bytes(response.data.reason or b"")
    headers = [(bytes(k), bytes(v)) for k, v in response.headers.fields]
    trailers = [(bytes(k), bytes(v)) for k, v in response.trailers.fields] if response.trailers is not None else None
    found = False
    for secret in mine:
        cleaner = _Cleaner(secret, name)
        reason = cleaner.clean(reason, "the reason phrase")
        headers = [(cleaner.clean(k, "a header name"), cleaner.clean(v, "a header")) for k, v in headers]
        if trailers is not None:
            trailers = [(cleaner.clean(k, "a trailer name"), cleaner.clean(v, "a trailer")) for k, v in trailers]
        body = cleaner.clean(body, "the body")
        found = found or cleaner.found
    response.data.reason = reason
    response.headers = http.Headers(headers)
    if trailers is not None:
        response.trailers = http.Headers(trailers)
    if encoded or body != (response.raw_content or b""):
        response.headers.pop("content-encoding", None)  # sent decoded: what was checked is what goes
        response.raw_content = body
        if "content-length" in response.headers:
            response.headers["content-length"] = str(len(body))
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
