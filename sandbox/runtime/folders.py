"""Creating host directories and files for a sandbox without ever following a link.

Engine-neutral: every backend whose workspace is a `HostFolder` (runtime/workspace_ref.py) has
it made here, Docker's before the engine mounts it, the host backend's before it runs there.

The orchestrator often runs as root and makes the directories a non-root sandbox writes to
(scratch workspaces) and the placeholders of protected paths. A link planted at any component
below the trusted anchor (by a sandbox that can write there) must not turn a `mkdir` + `chown`
into "hand a root-owned directory to uid 1000": every component is opened with `O_NOFOLLOW`
relative to its parent's fd, created with `mkdirat`/`O_EXCL`, and changed with `fchown`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox._log import logger
from sandbox.errors import ErrorCode, SandboxError, SandboxUnavailable

if TYPE_CHECKING:
    from sandbox.runtime.spec import SandboxSpec

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _refused(path: str, why: str) -> SandboxError:
    return SandboxError(ErrorCode.PERMISSION_DENIED, f"{path}: {why}; the sandbox was not created", path=path)


def _open_dir(parent: int, name: str, shown: str, *, create: bool, mode: int = 0o755) -> tuple[int, bool]:
    """Open (or make) one directory below `parent`, refusing links and non-directories."""
    made = False
    while True:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent), made
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(name, mode, dir_fd=parent)
                made = True
            except FileExistsError:
                continue  # someone made it meanwhile: open (and check) what is there
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                kind = "a symbolic link" if _is_link(parent, name) else "not a directory"
                raise _refused(shown, f"is {kind}; links are never followed here") from exc
            raise


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
    except OSError:
        return False


@contextmanager
def anchor(root: Path) -> Iterator[int]:
    """An fd on `root`, the trusted starting point (made with its parents when missing).

    `root` itself comes from the operator's config; links in it are the operator's choice and
    are resolved. Everything below it is walked without following links.
    """
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(os.path.realpath(root), _DIR_FLAGS)
    try:
        yield fd
    finally:
        os.close(fd)


# group-writable and setgid: what one session makes there, the agent's other sessions can change
SHARED_DIR_MODE = 0o2775


def _walk(root: Path, parts: Sequence[str], owner: tuple[int, int] | None, chown_existing: bool) -> tuple[int, str]:
    """Open (making what is missing) `root/parts...`; the caller closes the returned fd."""
    with anchor(root) as top:
        fd = os.dup(top)
    shown = os.path.realpath(root)
    try:
        for index, name in enumerate(parts):
            _check_name(name, shown)
            shown = os.path.join(shown, name)
            child, made = _open_dir(fd, name, shown, create=True)
            os.close(fd)
            fd = child
            last = index == len(parts) - 1
            if owner is not None and (made or (last and chown_existing)):
                os.fchown(fd, *owner)
    except BaseException:
        os.close(fd)
        raise
    return fd, shown


def ensure_dir(
    root: Path,
    parts: Sequence[str],
    *,
    owner: tuple[int, int] | None,
    chown_existing: bool,
    mode: int | None = None,
) -> str:
    """Make `root/parts...` as real directories, never following a link at any component.

    Args:
        root: the trusted anchor (see :func:`anchor`).
        parts: the components below it.
        owner: uid, gid given to every directory this call creates (None: leave as made).
        chown_existing: also give the last directory to `owner` when it already existed.
        mode: permissions set on the last directory (through its fd), whether made or found.

    Returns:
        The real path of the directory (what the engine gets as a mount source).

    Raises:
        SandboxError: PERMISSION_DENIED when a component is a link or not a directory.
    """
    fd, shown = _walk(root, parts, owner, chown_existing)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return shown


def ensure_file(root: Path, parts: Sequence[str], *, owner: tuple[int, int] | None) -> tuple[str, bool]:
    """Make `root/parts...` an (empty, when new) regular file; parents as in :func:`ensure_dir`.

    Returns:
        The real path and whether it was created.

    Raises:
        SandboxError: PERMISSION_DENIED when a component is a link or of the wrong type.
    """
    *dirs, leaf = parts
    parent, parent_path = _walk(root, dirs, owner, False)
    shown = os.path.join(parent_path, leaf)
    try:
        _check_name(leaf, shown)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd, made = os.open(leaf, flags, 0o644, dir_fd=parent), True
        except FileExistsError:
            try:
                fd, made = os.open(leaf, _FILE_FLAGS, dir_fd=parent), False
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _refused(shown, "is a symbolic link; links are never followed here") from exc
                raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _refused(shown, "is not a regular file")
            if made and owner is not None:
                os.fchown(fd, *owner)
        finally:
            os.close(fd)
    finally:
        os.close(parent)
    return shown, made


def _check_name(name: str, shown: str) -> None:
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise _refused(shown, f"bad path component {name!r}")


def prepare_workspace(spec: SandboxSpec) -> None:
    """Make the host side of a sandbox's workspace before the engine mounts it.

    A scratch workspace is made under its `workspace_root` and given to the sandbox user; a
    bound workspace is made when missing, then its protected paths (as the workspace's owner).

    Raises:
        SandboxError: PERMISSION_DENIED when a link sits where a directory or file is made, or
            the scratch root is owned by someone else.
        SandboxUnavailable: the workspace is a volume (the engine's to make; no host folder).
    """
    source = spec.workspace.host_path
    if source is None:
        raise SandboxUnavailable(f"the workspace is volume {spec.workspace.source}: there is no host folder to make")
    if spec.workspace_access == "none":
        # sessions with users of their own share the scratch workspace through its group
        _prepare_scratch(source, _sandbox_owner(spec), SHARED_DIR_MODE if spec.session_users else None)
        return
    ensure_dir(source.parent, [source.name], owner=_sandbox_owner(spec), chown_existing=False)
    info = os.stat(source)
    # made as the workspace's owner, so the user's own git keeps working on them
    owner = (info.st_uid, info.st_gid) if os.geteuid() == 0 else None
    for mount in spec.protected:
        if mount.kind == "file":
            ensure_file(source, mount.parts, owner=owner)
        else:
            ensure_dir(source, mount.parts, owner=owner, chown_existing=False)


def _sandbox_owner(spec: SandboxSpec) -> tuple[int, int] | None:
    uid, _, gid = spec.user.partition(":")
    if os.geteuid() != 0 or not uid.isdigit() or not (gid or uid).isdigit():
        return None
    return int(uid), int(gid or uid)


def _prepare_scratch(workspace: Path, owner: tuple[int, int] | None, mode: int | None) -> None:
    # workspace_root/<tenant folder>/<scratch>: the root and the tenant folder are the orchestrator's
    tenant_dir = workspace.parent
    root = tenant_dir.parent
    root.mkdir(parents=True, exist_ok=True)
    info = os.stat(root)
    if info.st_uid not in (os.geteuid(), 0):
        # whoever owns the root could plant links in it between our walk and the engine's mount
        raise SandboxError(
            ErrorCode.PERMISSION_DENIED,
            f"workspace_root {root} is owned by uid {info.st_uid}, not by the orchestrator; "
            "the sandbox was not created",
            path=str(root),
        )
    ensure_dir(root, [tenant_dir.name], owner=None, chown_existing=False)
    _move_legacy_scratch(root, tenant_dir, workspace.name)
    ensure_dir(tenant_dir, [workspace.name], owner=owner, chown_existing=True, mode=mode)


def _move_legacy_scratch(root: Path, tenant_dir: Path, name: str) -> None:
    """Scratch workspaces used to sit directly in the root: one made then moves into its tenant's
    folder on first use (a rename: same disk, nothing copied), so no session loses its files."""
    legacy = root / name
    try:
        info = os.lstat(legacy)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        return  # never a link or a file: only a folder this orchestrator made moves
    try:
        os.rename(legacy, tenant_dir / name)
    except OSError as exc:
        # both places hold files (orchestrators of two versions on one root): the old folder
        # stays where it is, uncounted by the tenant's quota; an operator merges them
        logger.bind(path=str(legacy), reason=exc.strerror).warning("legacy_scratch_not_moved")
