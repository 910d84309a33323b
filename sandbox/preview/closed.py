"""Sessions closed since a link was made: their links stop working (docs/preview.md).

Where a sandbox outlives its session (agent or shared scope), the container a link names is
still there after the session closed; the close is therefore noted here, one empty file per
closed session whose modification time is when it closed, and a link made before it is
refused. A session-scoped sandbox needs none of this (its container goes with it). Notes older
than the longest link life are swept as new ones are written, so the folder stays small.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

FOLDER = "preview-closed"
KEEP_S = 7 * 86400 + 3600  # past sandbox.preview.link_ttl_s's largest value


def _note(state_dir: Path, tenant: str, session: str) -> Path:
    name = hashlib.sha256(f"{tenant}\0{session}".encode()).hexdigest()[:40]
    return state_dir / FOLDER / name


def mark_closed(state_dir: Path, tenant: str, session: str, *, now: float | None = None) -> None:
    """Note that the session closed now (links made before are refused from now on)."""
    note = _note(state_dir, tenant, session)
    note.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.time() if now is None else now
    note.touch()
    os.utime(note, (stamp, stamp))
    _sweep(note.parent, stamp)


def closed_since(state_dir: Path, tenant: str, session: str, issued: float) -> bool:
    """Whether the session closed at or after `issued` (a link made then no longer holds)."""
    try:
        return _note(state_dir, tenant, session).stat().st_mtime >= issued
    except OSError:
        return False


def _sweep(folder: Path, now: float) -> None:
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime > KEEP_S:
                    os.unlink(entry.path)
