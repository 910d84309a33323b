"""Container names, scope keys and labels: the engine itself is the inventory."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
from pathlib import Path

from sandbox.errors import StateError, storage_error
from sandbox.fs.safe import fsync_dir

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
    # a warm-pool member (runtime/docker/pool.py): its pool key, and its scratch folder until claimed
    POOL = f"{LABEL_PREFIX}.pool"
    POOL_SCRATCH = f"{LABEL_PREFIX}.pool-scratch"
    AGENT_LINK = f"{LABEL_PREFIX}.agent-link"  # the host folder of its agents' FIFOs (runtime/link_folders.py)


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


def container_name(instance: str, kind: str, key: str, *, tenant: str) -> str:
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


INSTANCE_FILE = "instance-id"
INSTANCE_PATTERN = re.compile(r"[a-z0-9]{4,16}")
NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


def instance_id(state_dir: Path, configured: str | None) -> str:
    """The configured instance id, else the one kept in the state dir (made there once).

    The id is in the label of every container this orchestrator made: a new one would leave
    them all invisible to `list`, `recreate` and `prune`. So only a missing file is made, and
    made atomically (two processes starting at once agree on one id); a damaged or unreadable
    one is an error, never replaced.

    Raises:
        StateError: the file is damaged or cannot be read.
        SandboxError: SERVICE_UNAVAILABLE when the disk is full (a missing file cannot be made).
    """
    if configured:
        return configured
    path = state_dir / INSTANCE_FILE
    found = _read_instance(path)
    if found is not None:
        return found
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        return _make_instance(path)
    except OSError as exc:
        raise storage_error(exc, f"the instance id cannot be written to {path}") from exc


def _read_instance(path: Path) -> str | None:
    """The id in `path`; None when there is no file."""
    fix = (
        "restore the id the containers of this state dir carry (docker ps -a --filter "
        f"label={Labels.MANAGED}=true --format '{{{{.Label \"{Labels.INSTANCE}\"}}}}'), or set `instance:` "
        "in the config to it; remove the file only when no container of the old id is left"
    )
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"the instance id file {path} cannot be read ({exc.strerror or exc})", path, fix) from exc
    value = raw.decode("ascii", "replace").strip()
    if not INSTANCE_PATTERN.fullmatch(value):
        shown = repr(value[:40]) if value else "empty"
        raise StateError(
            f"the instance id file {path} is damaged ({shown}; expected 4-16 lower-case letters and digits)",
            path,
            fix,
        )
    return value


def _make_instance(path: Path) -> str:
    """Write a new id to a temporary file, then link it to `path`: `link` fails when `path`
    exists, so the first process wins and every other one reads the winner's id; the file is
    never seen half-written (a full disk fails on the temporary file)."""
    value = secrets.token_hex(3)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            fsync_dir(path.parent)  # containers will carry this id: it must outlive a crash
        except FileExistsError:
            pass  # another process made it first: its id is the one
        except OSError as exc:
            if exc.errno not in NO_HARD_LINKS:
                raise
            _make_exclusive(path, value)
    finally:
        tmp.unlink(missing_ok=True)
    found = _read_instance(path)
    if found is None:  # removed between our link and our read: nothing sane to guess
        raise StateError(f"the instance id file {path} vanished while it was made", path, "start again")
    return found


def _make_exclusive(path: Path, value: str) -> None:
    """Where hard links are refused (some network and FUSE filesystems): create `path` with
    O_EXCL and remove it again if it cannot be written whole."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
    except OSError:
        path.unlink(missing_ok=True)
        raise
