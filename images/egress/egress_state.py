"""The proxy's policy (from $EGRESS_POLICY), its verdict on a host, and its one log line per request."""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

from egress_rules import IPAddress, host_address_set, host_allowed, normal_host

POLICY: dict[str, Any] = json.loads(os.environ.get("EGRESS_POLICY") or "{}")
ALLOW: list[str] = list(POLICY.get("allow", []))
FLOOR: list[str] | None = POLICY.get("floor")  # the tenant's list; None: no tenant list
PORTS: set[int] = {int(p) for p in POLICY.get("ports", [80, 443])}
EXEMPT: list[str] = list(POLICY.get("allow_private", []))
# the host's own addresses (the orchestrator's list): refused whatever EXEMPT says
HOST: frozenset[IPAddress] = host_address_set(list(POLICY.get("host_addresses", [])))
MAX_BYTES: int = int(POLICY.get("max_bytes", 256 * 1024 * 1024))
MAX_DURATION_S: float = float(POLICY.get("max_duration_s", 300))
MAX_HEADER_BYTES = 64 * 1024  # a request's headers; mitmproxy itself sets no limit
HELLO_TIMEOUT_S = 10.0  # a tunnel must show its whole TLS ClientHello within this
MAX_HELLO_BYTES = 64 * 1024
RESOLVE_TIMEOUT_S = 5.0
IDENTITY: dict[str, str] = {k: str(v)[:256] for k, v in POLICY.get("identity", {}).items()}
# what a field of a line may hold: a line stays far below what the orchestrator reads (4 KiB)
FIELD_CAPS = {"method": 32, "host": 255, "reason": 512, "injected": 512, "client": 64}
_seq = itertools.count(1)


def peer(client: Any) -> str:
    """A client connection's address: which sandbox sent a request, where one proxy serves many
    (a cluster's proxy serves every sandbox of its policy in a namespace)."""
    peername = getattr(client, "peername", None)
    return str(peername[0]) if peername else ""


def emit(**fields: Any) -> None:
    """One request, one line, numbered: the orchestrator reads lines that start with {"egress":.

    Every text field is cut to its cap, so no request can make a line the reader would skip.
    """
    for key, cap in FIELD_CAPS.items():
        if isinstance(fields.get(key), str):
            fields[key] = fields[key][:cap]
    line = {"egress": next(_seq), "ts": round(time.time(), 3), **IDENTITY, **fields}
    print(json.dumps(line), flush=True)


def host_refusal(host: str, port: int) -> str | None:
    """Why this (host, port) is off the policy, or None."""
    if port not in PORTS:
        return f"port {port} is not on the egress port list {sorted(PORTS)}"
    if not host_allowed(host, ALLOW):
        return f"host {normal_host(host)} is not on the egress allowlist"
    if FLOOR is not None and not host_allowed(host, FLOOR):
        return f"host {normal_host(host)} is not on the tenant's egress allowlist"
    return None
