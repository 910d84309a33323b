"""Container names, scope keys and labels: the engine itself is the inventory."""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

LABEL_PREFIX = "io.agent-sandbox"
SCHEMA_VERSION = "1"
# Bumped when the way workspaces and binds are laid out inside the container changes.
MOUNT_LAYOUT_VERSION = "2"


CREATOR_LABEL = f"{LABEL_PREFIX}.creator"  # host:pid of the process creating a container
CREATING_MARK = "-creating-"  # in the name of a container whose setup is not finished


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
    # a warm-pool member (runtime/pool.py): its pool key, and its scratch folder until claimed
    POOL = f"{LABEL_PREFIX}.pool"
    POOL_SCRATCH = f"{LABEL_PREFIX}.pool-scratch"


DEFAULT_TENANT = "default"
NAME_HASH_LENGTH = 24  # 96 bits: keys differing only in case or punctuation never meet


def scope_key(scope: str, agent: str, session: str) -> str:
    """The key that decides which sessions of one tenant share a container.

    The tenant is not in this text (labels carry it separately); everything that must keep
    tenants apart (names, scratch paths, caches) goes through :func:`tenant_scope`.
    """
    if scope == "session":
        return session
    if scope == "agent":
        return f"agent:{agent}"
    return "shared"


def tenant_scope(tenant: str, key: str) -> str:
    """`<tenant>|<scope key>`: the identity two tenants can never share.

    Tenant ids have no `|` and validated session keys have none either, so the split is unique.
    """
    return f"{tenant}|{key}"


def slug(text: str, limit: int = 24) -> str:
    """Lower-case [a-z0-9-] only, for readable names."""
    out = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return out[:limit].strip("-") or "x"


def short_hash(text: str, length: int = 10) -> str:
    """A stable short hex digest."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def container_name(instance: str, kind: str, key: str, *, tenant: str = DEFAULT_TENANT) -> str:
    """`sbx-<instance>-<kind>-<slug>-<hash>`, at most 63 characters.

    The 96-bit hash of tenant, kind and the full key keeps keys apart that one slug would
    merge (case, punctuation, length); the slug takes whatever room is left and is only for
    people. The instance id keeps two orchestrators on one engine apart.
    """
    digest = short_hash(f"{kind}|{tenant_scope(tenant, key)}", NAME_HASH_LENGTH)
    prefix = f"sbx-{instance}-{kind}-"
    room = 63 - len(prefix) - len(digest) - 1
    readable = slug(key, room) if room > 0 else ""
    name = f"{prefix}{readable}-{digest}" if readable else f"{prefix}{digest}"
    assert len(name) <= 63, name
    return name


def scratch_dir_name(tenant: str, key: str) -> str:
    """The name of a scratch workspace: a neutral hash (mountinfo shows it inside the sandbox)."""
    return short_hash(f"scratch|{tenant_scope(tenant, key)}", 32)


def tenant_dir_name(tenant: str) -> str:
    """The folder of a workspace_root that holds one tenant's scratch workspaces: a neutral hash,
    so a tenant's disk use is one walk (tenants[].quotas.max_workspace_bytes)."""
    return short_hash(f"tenant|{tenant}", 16)


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
