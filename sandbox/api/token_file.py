"""The state dir's token file, `tenant-tokens.json`: the hashes of the tokens that
`sandbox tenants token create` made (a JSON list of `{tenant, name, sha256}`, 0600).

A damaged file is never taken for an empty one where that would lose tokens or hide the damage:
creating a token and starting the service read it strictly (an error naming the file and the
fix). A running service reads it again whenever it changes, leniently: while it is damaged its
tokens are refused (fail closed: an operator who broke the file while removing a token must not
see that token work again) and the damage is logged once per version of the file.
Writes are atomic: a new file beside it, synced, renamed over it; a read-modify-write holds
the lock file beside it, so two `token create` at once both keep their token.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandbox._log import logger
from sandbox.errors import StateError, storage_error
from sandbox.fs.safe import fsync_dir

TOKEN_FILE = "tenant-tokens.json"  # noqa: S105 - a file name, not a secret
LOCK_FILE = ".tenant-tokens.lock"
FIX = (
    "repair the JSON (a list of {tenant, name, sha256}) or move the file away and create the "
    "tokens again (`sandbox tenants token create`); tokens under tenants[].tokens in the config still work"
)

# the file's identity: a rewrite (write_tokens renames a new file in) changes the inode even
# within one tick of a coarse mtime
_Version = tuple[int, int, int]
_cache: dict[Path, tuple[_Version, list[dict[str, str]]]] = {}
_damaged: dict[Path, _Version] = {}  # the version last logged as damaged (logged once)
UNKNOWN: _Version = (-1, -1, -1)  # the version of a file that cannot even be stat()ed
_NONE_STORED: list[dict[str, str]] = []  # one object, so that callers can tell "unchanged" by identity


def read_tokens(state_dir: Path, *, strict: bool) -> list[dict[str, str]]:
    """The stored token hashes, read again only when the file changed (callers must not change
    the list: it is the cache's). No file: none.

    Args:
        state_dir: the config's state dir.
        strict: raise on a damaged or unreadable file; else refuse its tokens (none) and log.

    Raises:
        StateError: (strict) the file cannot be read or is not a list of tokens.
    """
    path = state_dir / TOKEN_FILE
    try:
        st = path.stat()
    except FileNotFoundError:
        return _NONE_STORED
    except OSError as exc:
        return _damaged_file(path, UNKNOWN, f"cannot be read ({exc.strerror or exc})", strict, exc)
    version = (st.st_ino, st.st_mtime_ns, st.st_size)
    cached = _cache.get(path)
    if cached is not None and cached[0] == version:
        return cached[1]
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        return _damaged_file(path, version, f"cannot be read ({exc.strerror or exc})", strict, exc)
    except ValueError as exc:
        return _damaged_file(path, version, f"is not valid JSON ({exc})", strict, exc)
    if not isinstance(data, list) or not all(_is_token(t) for t in data):
        return _damaged_file(path, version, "is not a list of {tenant, name, sha256}", strict, None)
    _cache[path] = (version, data)
    _damaged.pop(path, None)
    return data


def _is_token(item: object) -> bool:
    return (
        isinstance(item, dict)
        and all(isinstance(item.get(k), str) for k in ("tenant", "sha256"))
        and isinstance(item.get("name", ""), str)
    )


def _damaged_file(
    path: Path, version: _Version, why: str, strict: bool, exc: BaseException | None
) -> list[dict[str, str]]:
    if strict:
        raise StateError(f"the token file {path} {why}", path, FIX) from exc
    if _damaged.get(path) != version:
        logger.bind(path=str(path), reason=why).error("token_file_damaged")
        _damaged[path] = version
    _cache.pop(path, None)
    return _NONE_STORED


def write_tokens(state_dir: Path, tokens: list[dict[str, str]]) -> None:
    """Replace the token file with `tokens`, atomically (0600; the state dir is made 0700).

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the disk is full, INTERNAL for another write
            failure; the old file is left as it was.
    """
    path = state_dir / TOKEN_FILE
    tmp = path.with_name(f".{TOKEN_FILE}.{secrets.token_hex(4)}")
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(tokens, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        fsync_dir(state_dir)
    except OSError as exc:
        raise storage_error(exc, f"the token file {path} cannot be written") from exc
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def tokens_locked(state_dir: Path) -> Iterator[None]:
    """Hold the token file's lock for a read-modify-write (other processes wait).

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the disk is full, INTERNAL when the lock file
            cannot be made.
    """
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise storage_error(exc, f"the token file's lock in {state_dir} cannot be made") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for a few milliseconds by another `token create`
        yield
    finally:
        os.close(fd)  # releases the lock
