"""Container names, scope keys and labels: the engine itself is the inventory."""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

LABEL_PREFIX = "io.agent-sandbox"
SCHEMA_VERSION = "1"
# Bumped when the way workspaces and binds are laid out inside the container changes.
MOUNT_LAYOUT_VERSION = "1"


class Labels:
    """Label keys set on every container this orchestrator makes."""

    MANAGED = f"{LABEL_PREFIX}.managed"
    INSTANCE = f"{LABEL_PREFIX}.instance"
    KIND = f"{LABEL_PREFIX}.kind"  # exec | browser
    TENANT = f"{LABEL_PREFIX}.tenant"
    AGENT = f"{LABEL_PREFIX}.agent"
    SCOPE = f"{LABEL_PREFIX}.scope"
    SCOPE_KEY = f"{LABEL_PREFIX}.scope-key"
    SESSION = f"{LABEL_PREFIX}.session"
    CONFIG_HASH = f"{LABEL_PREFIX}.config-hash"
    CREATED_AT = f"{LABEL_PREFIX}.created-at"
    LAST_USED = f"{LABEL_PREFIX}.last-used"  # at creation; live value is in the state dir
    SCHEMA = f"{LABEL_PREFIX}.schema"
    READY = f"{LABEL_PREFIX}.ready"


def scope_key(scope: str, agent: str, session: str) -> str:
    """The key that decides which sessions share a container."""
    if scope == "session":
        return session
    if scope == "agent":
        return f"agent:{agent}"
    return "shared"


def slug(text: str, limit: int = 24) -> str:
    """Lower-case [a-z0-9-] only, for readable names."""
    out = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return out[:limit].strip("-") or "x"


def short_hash(text: str, length: int = 10) -> str:
    """A stable short hex digest."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def container_name(instance: str, kind: str, key: str) -> str:
    """`sbx-<instance>-<kind>-<slug>-<hash>`, at most 63 characters.

    The hash of the full key keeps two long keys with one slug apart; the instance id keeps
    two orchestrators on one engine apart.
    """
    name = f"sbx-{instance}-{kind}-{slug(key, 20)}-{short_hash(f'{kind}|{key}')}"
    assert len(name) <= 63, name
    return name


def instance_id(state_dir: Path, configured: str | None) -> str:
    """The configured instance id, else one made once and kept in the state dir."""
    if configured:
        return configured
    path = state_dir / "instance-id"
    try:
        value = path.read_text().strip()
        if re.fullmatch(r"[a-z0-9]{4,16}", value):
            return value
    except FileNotFoundError:
        pass
    state_dir.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(3)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(value + "\n")
    tmp.replace(path)
    return value
