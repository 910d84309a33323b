"""Each sandbox's folder of agent FIFOs on this host (runtime/agent/fifo_link.py): made with the
container, mounted read-only at `/run/agent-link`, removed with it, swept when left behind.

The backend decides whether its engine can mount them (Docker: runtime/docker/backend.py's
`link_refusal`); these are the folders' own rules, engine-neutral.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from sandbox.runtime.spec import AGENT_LINKS_DIR

OFF_ENV = "SANDBOX_AGENT_LINK"  # "stream": no FIFO links on this host
SWEEP_AFTER_S = 600  # a younger folder may belong to a container being made right now
_FOLDER = re.compile(r"[0-9a-f]{32}")


def refused_here() -> str | None:
    """Why this host gives no sandbox a link folder (None: it may; the engine has the last word)."""
    if os.environ.get(OFF_ENV, "").strip().lower() == "stream":
        return f"{OFF_ENV}=stream"
    return None


def make(root: str) -> Path:
    """A new, empty link folder under `root` (mode 0711: the agent can open a FIFO whose name it
    is told, nothing inside can list the folder)."""
    base = Path(root)
    base.mkdir(mode=0o711, parents=True, exist_ok=True)
    folder = base / secrets.token_hex(16)
    folder.mkdir(mode=0o711)
    folder.chmod(0o711)  # past the umask
    return folder


def is_link_folder(path: str) -> bool:
    """Whether `path` is shaped like one of ours: a 32-hex folder in an `agent-links` folder."""
    folder = Path(path)
    return folder.is_absolute() and bool(_FOLDER.fullmatch(folder.name)) and folder.parent.name == AGENT_LINKS_DIR


def remove(folder: str | Path) -> None:
    """Remove a link folder and the FIFOs left in it; nothing else. The path comes from the
    engine's data: only a folder shaped like ours is touched, never through a link, and only
    FIFOs in it are unlinked (a forged path cannot delete files)."""
    if not is_link_folder(str(folder)):
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for entry in os.scandir(fd):
            if stat.S_ISFIFO(entry.stat(follow_symlinks=False).st_mode):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):  # not empty (something not ours, left in place), or gone
        os.rmdir(folder)


def sweep(root: str, in_use: Iterable[str], now: float) -> list[str]:
    """Remove the link folders under `root` that no container names (`in_use`: the folders
    in the link labels of every container of this instance), once older than
    :data:`SWEEP_AFTER_S`; the folders removed."""
    keep = {Path(p).name for p in in_use}  # by name: 128 random bits each, however the root is spelled
    gone: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root):
            if not _FOLDER.fullmatch(entry.name) or entry.name in keep or not entry.is_dir(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime >= SWEEP_AFTER_S:
                remove(entry.path)
                if not os.path.exists(entry.path):
                    gone.append(entry.path)
    return gone
