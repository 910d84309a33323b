"""Where a skill handler runs: a short-lived sandbox of its own, or a bare host process.

A skill declares which paths it reads and writes (`permissions.filesystem`) and whether it
needs the network. In a sandboxed session the handler does not run in the session's container
(which sees the whole workspace, read-write): it gets a container made for the one call that
mounts only the declared paths, read-only unless `write` declares them, the skill's own folder
read-only at /opt/skill, and no network unless the skill declares some. The container is
removed after the call, so a timeout kills everything the handler started.

Declared globs are enforced at directory granularity: `/workspace/src/*.py` mounts
`/workspace/src` (the deepest directory every match lies under). In mode `off` the handler is a
host process started from an argv with a minimal environment (none of the orchestrator's).
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
import stat
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandbox.config.binds import CONTAINER_WORKDIR
from sandbox.errors import ErrorCode, SandboxError, SandboxUnavailable
from sandbox.runtime.host_process import run_process
from sandbox.runtime.naming import container_name
from sandbox.runtime.output import OutputCapture
from sandbox.runtime.protocol import ExecResult
from sandbox.runtime.spec import Mount, SandboxSpec

SKILL_HOME = "/opt/skill"  # the skill's own folder inside its container
HOST_PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_OUTPUT = 16 * 1024 * 1024


def fixed_dir(pattern: str) -> str:
    """The deepest directory every match of a path glob lies under (the glob itself when literal)."""
    if not re.search(r"[*?\[]", pattern):
        return posixpath.normpath(pattern)
    head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    return posixpath.normpath(head.rsplit("/", 1)[0] or "/")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _host_path(session: SandboxSpec, target: str) -> tuple[Mount, str] | None:
    """The session mount that holds container path `target`, and the host path of `target`."""
    holders = [m for m in session.mounts if _within(target, m.target) and not m.origin.startswith("skills.dirs")]
    if not holders:
        return None
    mount = max(holders, key=lambda m: len(m.target))
    rel = posixpath.relpath(target, mount.target)
    return mount, mount.source if rel == "." else posixpath.join(mount.source, rel)


def _no_links_below(root: str, path: str) -> bool:
    """Whether every component of `path` below `root` exists and is not a symlink (the sandbox could plant one)."""
    rel = posixpath.relpath(path, root)
    current = root
    for part in [] if rel == "." else rel.split("/"):
        current = posixpath.join(current, part)
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return False
        except OSError:
            return False
    return True


@dataclasses.dataclass(frozen=True)
class SkillCall:
    """One skill call, as any backend's one-shot sandbox needs it: the skill's folder (on the
    orchestrator's host), the paths it declares, whether it declares a network, and the call."""

    skill: str
    folder: Path
    read: tuple[str, ...]
    write: tuple[str, ...]
    network: bool
    call_id: str


def declared_dirs(read: Sequence[str], write: Sequence[str]) -> dict[str, bool]:
    """Each directory a skill's declared globs grant (see :func:`fixed_dir`) -> writable, without
    a path inside another granted one that gives at least as much."""
    wanted: dict[str, bool] = {}
    for pattern, writable in [*((p, False) for p in read), *((p, True) for p in write)]:
        target = fixed_dir(pattern)
        wanted[target] = wanted.get(target, False) or writable
    return {
        t: w
        for t, w in wanted.items()
        if not any(o != t and _within(t, o) and (wo or not w) for o, wo in wanted.items())
    }


def under_protected(session: SandboxSpec, target: str) -> bool:
    """Whether workspace path `target` is a read-only protected path or lies inside one (a skill
    granted it gets it read-only, as the session has it)."""
    return any(p.read_only and _within(target, posixpath.join(CONTAINER_WORKDIR, p.rel)) for p in session.protected)


def skill_mounts(
    session: SandboxSpec, skill_folder: Path, read: Sequence[str], write: Sequence[str]
) -> tuple[Mount, ...]:
    """The mounts of a skill's container: its folder, and each declared path the session can reach.

    A path is read-write only when `write` declares it and the session mounts it read-write;
    protected paths (`.git/hooks`, ...) stay read-only inside a writable one. Declared paths that
    do not exist, or that pass through a link, are not mounted.
    """
    wanted = declared_dirs(read, write)
    mounts = [Mount(os.path.realpath(skill_folder), SKILL_HOME, True, "the skill's folder")]
    for target, writable in sorted(wanted.items(), key=lambda kv: kv[0].count("/")):
        found = _host_path(session, target)
        if found is None:
            continue
        holder, host = found
        if not os.path.exists(host) or not _no_links_below(holder.source, host):
            continue
        protected = holder is session.mounts[0] and under_protected(session, target)
        rw = writable and not holder.read_only and not protected
        origin = f"skill permissions.filesystem.{'write' if rw else 'read'} {target}"
        try:
            seen = os.lstat(host)  # a link swapped in since the walk has its own inode: refused later
        except OSError:
            continue
        mounts.append(Mount(host, target, not rw, origin, identity=(seen.st_dev, seen.st_ino)))
        if rw and holder is session.mounts[0]:
            for p in session.protected:
                inner = posixpath.join(holder.target, p.rel)
                if _within(inner, target) and os.path.lexists(posixpath.join(holder.source, p.rel)):
                    mounts.append(Mount(posixpath.join(holder.source, p.rel), inner, p.read_only, p.origin))
    return tuple(mounts)


# run in a skill's sandbox before its handler (nothing of the skill runs there yet): each granted
# path must show the very folder that was checked, by device and inode. The check and the mount
# are apart in time, and a session that swaps a declared folder for a link in between would
# otherwise get the link's target mounted. argv: the expected identities as JSON, or `-f FILE`.
VERIFY_SCRIPT = """
import json, os, sys
want = json.load(open(sys.argv[2])) if sys.argv[1] == "-f" else json.loads(sys.argv[1])
bad = []
for target, ident in sorted(want.items()):
    try:
        st = os.stat(target)
        ok = ident is not None and [st.st_dev, st.st_ino] == list(ident)
    except OSError:
        ok = False
    if not ok:
        bad.append(target)
print(json.dumps(bad))
"""


def verify_argv(expected: Mapping[str, tuple[int, int] | None] | None = None, file: str | None = None) -> list[str]:
    """The argv that checks the granted mounts (VERIFY_SCRIPT), from `expected` or a file of them."""
    args = ["-f", file] if file is not None else [json.dumps(expected or {})]
    return ["python3", "-I", "-S", "-c", VERIFY_SCRIPT, *args]


def verified(result: ExecResult) -> None:
    """Raise when the check found a granted path that is not the folder checked (or failed).

    Raises:
        SandboxError: PERMISSION_DENIED naming the paths; SANDBOX_UNAVAILABLE when it did not run.
    """
    try:
        bad = json.loads(result.stdout) if result.exit_code == 0 else None
    except ValueError:
        bad = None
    if bad is None:
        raise SandboxUnavailable(
            f"the skill's sandbox could not check its mounts (exit {result.exit_code}): "
            f"{result.stderr.decode(errors='replace')[-300:]}"
        )
    if bad:
        raise SandboxError(
            ErrorCode.PERMISSION_DENIED,
            f"declared path(s) {', '.join(bad)} changed while the skill's sandbox was made (a link or another "
            "folder took their place), so the skill was not run; the workspace is as it was",
        )


def skill_spec_for(
    session: SandboxSpec, skill: str, mounts: tuple[Mount, ...], *, network: bool, call_id: str
) -> SandboxSpec:
    """The spec of one call's skill container: the session's hardening, the skill's mounts and network."""
    docker = session.docker.model_copy(
        update={"network": session.docker.network if network else "none", "setup_command": None, "binds": []}
    )
    # no network declared: no proxy either (a backend that reads `egress` would route it)
    egress = session.egress if network else None
    key = f"{session.scope_key}|skill:{skill}|{call_id}|{uuid.uuid4().hex[:8]}"
    return dataclasses.replace(
        session,
        name=container_name(session.instance, "skill", key, tenant=session.tenant),
        kind="skill",
        scope_key=key,
        mounts=mounts,
        docker=docker,
        egress=egress,
        protected=(),
        for_engine=True,
        hashed={**session.hashed, "mounts": [[m.source, m.target, m.read_only] for m in mounts]},
    )


def minimal_env(workdir: str, extra: Mapping[str, str]) -> dict[str, str]:
    """A host skill's whole environment: a plain PATH and locale, a HOME, and the skill's variables."""
    return {"PATH": HOST_PATH, "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": "/tmp", **extra}


async def run_on_host(argv: Sequence[str], env: Mapping[str, str], workdir: str, timeout_s: float) -> ExecResult:
    """Run `argv` (no shell) in its own process group; on timeout the whole group is killed."""
    return await run_process(
        argv, env=env, cwd=workdir, timeout_s=timeout_s, capture=OutputCapture(max_bytes=MAX_OUTPUT)
    )
