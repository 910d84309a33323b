"""Turning a path a model wrote into workspace components, refusing anything that could escape."""

from __future__ import annotations

import posixpath
import unicodedata
from dataclasses import dataclass

from sandbox.errors import ErrorCode, SandboxError

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
# Slash look-alikes that NFKC leaves alone; a model (or an attacker) writing them means `/`.
SLASH_LOOKALIKES = frozenset("\u2215\u2044\u29f8\u2571\u29f5\u29f9")


@dataclass(frozen=True)
class WorkspacePath:
    """A path inside one root, as components (never empty names, never `..`)."""

    parts: tuple[str, ...]

    @property
    def relative(self) -> str:
        """The path relative to its root, `.` for the root itself."""
        return "/".join(self.parts) or "."

    @property
    def name(self) -> str:
        """The last component ('' for the root)."""
        return self.parts[-1] if self.parts else ""


def invalid(message: str, **details: object) -> SandboxError:
    """An INVALID_ARGUMENTS error about a path."""
    return SandboxError(ErrorCode.INVALID_ARGUMENTS, message, **details)


def outside(path: str) -> SandboxError:
    """The one message for every path outside the workspace: it never says whether it exists."""
    return SandboxError(
        ErrorCode.PERMISSION_DENIED,
        f"path {path!r} is outside the workspace; use a path relative to the workspace",
        path=path,
    )


def split_path(path: str, roots: tuple[str, ...]) -> tuple[str, WorkspacePath]:
    """Map `path` to (root, components) for the first root it lies in.

    Relative paths are relative to `roots[0]` (the workspace). Absolute paths must lie under one
    of `roots` (container paths such as /workspace, or the host path of the workspace).

    Raises:
        SandboxError: INVALID_ARGUMENTS for malformed paths, PERMISSION_DENIED for escapes.
    """
    if "\x00" in path:
        raise invalid("path contains a NUL byte")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise invalid(f"path is longer than {MAX_PATH_BYTES} bytes")
    if unicodedata.normalize("NFKC", path) != path:
        raise invalid(
            f"path {path!r} contains look-alike characters (it changes under Unicode NFKC); "
            "write it in plain characters"
        )
    if any(ch in SLASH_LOOKALIKES for ch in path):
        raise invalid(f"path {path!r} contains a look-alike of '/'; write it in plain characters")
    if "\\" in path:
        raise invalid(f"path {path!r} contains a backslash; use / as the separator")
    if path.startswith("/"):
        normal = posixpath.normpath(path)
        for root in roots:
            if normal == root or normal.startswith(root.rstrip("/") + "/"):
                rel = normal[len(root.rstrip("/")) :].lstrip("/")
                return root, _components(rel, path)
        raise outside(path)
    joined = posixpath.normpath(posixpath.join("/", path))
    # normpath of "/" + p removes every `..` that would climb above the root: compare to
    # a plain join to notice the escape instead of silently clamping it
    naive = posixpath.normpath(path)
    if naive == ".." or naive.startswith("../"):
        raise outside(path)
    return roots[0], _components(joined.lstrip("/"), path)


def _components(rel: str, original: str) -> WorkspacePath:
    parts = tuple(p for p in rel.split("/") if p not in ("", "."))
    for part in parts:
        if part == "..":
            raise outside(original)
        if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise invalid(f"a component of {original!r} is longer than {MAX_NAME_BYTES} bytes")
    return WorkspacePath(parts)
