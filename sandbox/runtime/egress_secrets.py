"""`egress.secrets`: values read where the orchestrator runs, placeholders for the sandbox, and the
proxy's CA installed in the sandbox so the secrets' hosts (only they) can be decrypted there.

The sandbox's `$NAME` holds a random placeholder; its proxy holds the value (in its environment:
whoever may `docker inspect` the proxy may read it, as they may read the orchestrator's) and puts it
into requests to the secret's hosts. Each proxy makes its own CA at start; the sandbox trusts
the system's CAs plus that one (a bundle in its /tmp, owned by root), through the variables curl,
Python, pip, git and node read.
"""

from __future__ import annotations

import os
import secrets as random
from pathlib import Path
from typing import Any

from sandbox.errors import SandboxUnavailable

CA_BUNDLE = "/tmp/.egress/ca-bundle.pem"
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
)
# the image's own bundle first (Debian's path), then the proxy's CA; readable by all, writable by root
INSTALL_SCRIPT = (
    "set -e; umask 022; mkdir -p /tmp/.egress; "
    '{ cat /etc/ssl/certs/ca-certificates.crt 2>/dev/null || true; printf "%s\\n" "$1"; } > /tmp/.egress/ca-bundle.pem'
)


def resolve(policy: dict[str, Any], owner: str) -> list[dict[str, Any]]:
    """Each secret of a policy with its value and a fresh placeholder.

    Raises:
        SandboxUnavailable: a value cannot be read (the variable is unset, the file is missing or empty).
    """
    out = []
    for secret in policy.get("secrets", []):
        source = str(secret["value_from"])
        kind, _, where = source.partition(":")
        if kind == "env":
            value = os.environ.get(where, "")
            missing = f"the environment variable {where} is not set (or empty) where the orchestrator runs"
        else:
            try:
                value = Path(where).read_text(encoding="utf-8").strip()
            except OSError as exc:
                value, missing = "", f"{where} cannot be read ({exc.__class__.__name__})"
            else:
                missing = f"{where} is empty"
        if not value:
            raise SandboxUnavailable(f"egress secret {secret['name']}: {missing}", container=owner)
        placeholder = f"sbx-secret-{secret['name'].lower().replace('_', '-')}-{random.token_hex(12)}"
        out.append({**secret, "value": value, "placeholder": placeholder})
    return out


def upstream_ca_pem(policy: dict[str, Any], owner: str) -> str:
    """The PEM text of `egress.upstream_ca`, or "" when none is set.

    Raises:
        SandboxUnavailable: the file cannot be read or holds no certificate.
    """
    path = policy.get("upstream_ca")
    if not path:
        return ""
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeError) as exc:
        raise SandboxUnavailable(f"egress.upstream_ca {path} cannot be read ({exc})", container=owner) from exc
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise SandboxUnavailable(f"egress.upstream_ca {path} holds no PEM certificate", container=owner)
    return text


def sandbox_environment(placeholders: dict[str, str]) -> dict[str, str]:
    """The sandbox's `$NAME` placeholders and the CA variables (only when there are secrets)."""
    if not placeholders:
        return {}
    return {**placeholders, **{name: CA_BUNDLE for name in CA_VARIABLES}}
