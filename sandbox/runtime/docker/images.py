"""`sandbox images build`: the exec and browser images from images/, without any registry."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import re
import stat
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors

from sandbox.errors import SandboxUnavailable
from sandbox.runtime.docker.errors import mapped
from sandbox.runtime.naming import LABEL_PREFIX

BASE_IMAGE = "debian:bookworm-slim"
CONTEXT_LABEL = f"{LABEL_PREFIX}.context-hash"
# What an image was built from, recorded at build time so doctor and audit can show it.
BASE_LABEL = f"{LABEL_PREFIX}.base-image"
BASE_ID_LABEL = f"{LABEL_PREFIX}.base-image-id"
BASE_DIGEST_LABEL = f"{LABEL_PREFIX}.base-repo-digest"
BASE_SOURCE_LABEL = f"{LABEL_PREFIX}.base-source"  # set by images/bootstrap/base.sh on an imported base
SNAPSHOT_LABEL = f"{LABEL_PREFIX}.apt-snapshot"
PACKAGES_LABEL = f"{LABEL_PREFIX}.packages-sha256"
PACKAGE_COUNT_LABEL = f"{LABEL_PREFIX}.packages-count"
PROVENANCE_LABELS = (
    BASE_LABEL,
    BASE_ID_LABEL,
    BASE_DIGEST_LABEL,
    BASE_SOURCE_LABEL,
    SNAPSHOT_LABEL,
    PACKAGES_LABEL,
    PACKAGE_COUNT_LABEL,
)
_SNAPSHOT = re.compile(r"[0-9]{8}T[0-9]{6}Z")


@dataclass(frozen=True)
class ImageTarget:
    """One image built from a folder of images/."""

    name: str  # folder under images/
    tag: str


def images_dir() -> Path:
    """The images/ folder: $SANDBOX_IMAGES_DIR, else next to the package (a checkout)."""
    env = os.environ.get("SANDBOX_IMAGES_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "images"  # sandbox/runtime/docker/images.py


def context_hash(folder: Path, base_id: str) -> str:
    """Hash of every file in a build context plus the base image id."""
    digest = hashlib.sha256(base_id.encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def apt_snapshot() -> str:
    """The snapshot.debian.org timestamp apt is pinned to ($SANDBOX_APT_SNAPSHOT), or "" (unpinned).

    Raises:
        SandboxUnavailable: the value is not a snapshot timestamp like 20240601T000000Z.
    """
    value = os.environ.get("SANDBOX_APT_SNAPSHOT", "").strip()
    if value and not _SNAPSHOT.fullmatch(value):
        raise SandboxUnavailable(f"SANDBOX_APT_SNAPSHOT {value!r} is not a timestamp like 20240601T000000Z")
    return value


def installed_packages(status: str) -> list[str]:
    """`name:arch=version` of every installed package in a dpkg status file, sorted."""
    out = []
    for stanza in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            out.append(f"{fields['Package']}:{fields.get('Architecture', '?')}={fields.get('Version', '?')}")
    return sorted(out)


def _dpkg_status(client: Any, image_id: str) -> str:
    """The image's /var/lib/dpkg/status, read from a created (never started) container."""
    created = client.api.create_container(image_id, command=["true"], network_disabled=True)
    try:
        stream, _ = client.api.get_archive(created["Id"], "/var/lib/dpkg/status")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile("status")
            return member.read().decode("utf-8", "replace") if member else ""
    finally:
        client.api.remove_container(created["Id"], force=True)


def provenance_labels(client: Any, image_id: str, base: Any, snapshot: str) -> dict[str, str]:
    """The labels that say what an image was built from: base id and digest, apt pin, package list hash."""
    packages = installed_packages(_dpkg_status(client, image_id))
    digests = list(base.attrs.get("RepoDigests") or [])
    return {
        BASE_LABEL: BASE_IMAGE,
        BASE_ID_LABEL: str(base.id),
        BASE_DIGEST_LABEL: digests[0] if digests else "none (not from a registry)",
        BASE_SOURCE_LABEL: (base.labels or {}).get(BASE_SOURCE_LABEL) or ("registry" if digests else "unknown"),
        SNAPSHOT_LABEL: snapshot or "none (apt unpinned)",
        PACKAGES_LABEL: hashlib.sha256("\n".join(packages).encode()).hexdigest(),
        PACKAGE_COUNT_LABEL: str(len(packages)),
    }


def provenance(labels: Mapping[str, str] | None) -> dict[str, str]:
    """The provenance labels of an image (short names: base-image-id, packages-sha256, ...)."""
    found = labels or {}
    return {key.removeprefix(f"{LABEL_PREFIX}."): found[key] for key in PROVENANCE_LABELS if key in found}


def _stamp(client: Any, image_id: str, tag: str, labels: Mapping[str, str]) -> str:
    """Add labels to a built image (a one-line build on top of it: nothing is fetched or run)."""
    quoted = " ".join(f'{k}="{v}"' for k, v in labels.items())
    dockerfile = f"FROM {image_id}\nLABEL {quoted}\n"
    new_id = ""
    for chunk in client.api.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True, decode=True):
        if "error" in chunk:
            raise SandboxUnavailable(f"labelling {tag} failed: {chunk['error'].strip()}")
        if "aux" in chunk and "ID" in chunk["aux"]:
            new_id = chunk["aux"]["ID"]
    return new_id or str(client.images.get(tag).id)


def ensure_base(offline: bool, log: Callable[[str], None], client: Any = None) -> None:
    """Make sure the base image exists: present, pulled, or debootstrapped (images/bootstrap)."""
    if client is not None:
        # asked of the engine itself: where no docker CLI is installed (the service image), the
        # script could not see it
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.get(BASE_IMAGE)
            log(f"base: {BASE_IMAGE} present")
            return
    script = images_dir() / "bootstrap" / "base.sh"
    env = {**os.environ, "OFFLINE": "1" if offline else "0"}
    run = subprocess.run(["bash", str(script), BASE_IMAGE], env=env, capture_output=True, text=True, check=False)
    for line in (run.stdout + run.stderr).splitlines():
        log(line)
    if run.returncode != 0:
        raise SandboxUnavailable(f"could not provide the base image {BASE_IMAGE}; see the lines above")


def build_image(client: Any, target: ImageTarget, log: Callable[[str], None], *, force: bool = False) -> str:
    """Build one image unless an image with the same context hash exists; return its id."""
    folder = images_dir() / target.name
    snapshot = apt_snapshot()
    with mapped("build image"):
        base = client.images.get(BASE_IMAGE)
        wanted = context_hash(folder, _base_key(base.id, snapshot))
        try:
            existing = client.images.get(target.tag)
            if not force and (existing.labels or {}).get(CONTEXT_LABEL) == wanted:
                if PACKAGES_LABEL not in (existing.labels or {}):  # built before provenance labels
                    log(f"{target.tag}: recording provenance labels")
                    return _stamp(
                        client, existing.id, target.tag, provenance_labels(client, existing.id, base, snapshot)
                    )
                log(f"{target.tag}: up to date ({existing.short_id})")
                return str(existing.id)
        except docker.errors.ImageNotFound:
            pass
        log(f"{target.tag}: building from {folder}" + (f" (apt pinned to snapshot {snapshot})" if snapshot else ""))
        image_id = ""
        for chunk in client.api.build(
            path=str(folder),
            tag=target.tag,
            labels={CONTEXT_LABEL: wanted},
            buildargs={"APT_SNAPSHOT": snapshot},
            rm=True,
            forcerm=True,
            decode=True,
        ):
            text = str(chunk.get("stream", "")).rstrip()
            if text.startswith("Step "):
                log(f"  {text}")
            if "error" in chunk:
                raise SandboxUnavailable(f"building {target.tag} failed: {chunk['error'].strip()}")
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
        image_id = image_id or client.images.get(target.tag).id
        image_id = _stamp(client, image_id, target.tag, provenance_labels(client, image_id, base, snapshot))
        log(f"{target.tag}: built {image_id[:19]}")
        return image_id


def _base_key(base_id: str, snapshot: str) -> str:
    # a pinned build is another build: the snapshot is part of what the context hash covers
    return f"{base_id}|apt-snapshot={snapshot}" if snapshot else base_id


def build_all(
    client: Any,
    targets: list[ImageTarget],
    log: Callable[[str], None],
    *,
    offline: bool = False,
    force: bool = False,
) -> dict[str, str]:
    """Provide the base, then build every target; return tag -> image id.

    One build at a time on this host (a file lock): test workers, the demo and `sandbox images
    build` started together take turns, and whoever comes second finds the images current.
    """
    with _build_lock():
        ensure_base(offline, log, client)
        return {t.tag: build_image(client, t, log, force=force) for t in targets}


LOCK_WAIT_S = 1800.0  # a build that holds the lock longer than this is taken for stuck


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    path = lock_dir() / "images.lock"
    # in a folder only this user may write: nobody else can plant a link there or hold the lock
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the descriptor closes
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SandboxUnavailable(
                        f"another image build has held {path} for {LOCK_WAIT_S:.0f} s; if none runs, remove the file"
                    ) from None
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)


def lock_dir() -> Path:
    """This user's own folder for the build lock (images/bootstrap/base.sh uses the same one):
    $XDG_CACHE_HOME/agent-sandbox, else ~/.cache/agent-sandbox; made 0700 and checked to be the
    user's own and no link."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(base) / "agent-sandbox"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = folder.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise SandboxUnavailable(
            f"{folder} is not a folder of this user's own (0700): the build lock cannot live there"
        )
    return folder


def image_current(client: Any, target: ImageTarget) -> tuple[bool, str]:
    """Whether an image exists and matches its build context: (ok, explanation)."""
    folder = images_dir() / target.name
    try:
        image = client.images.get(target.tag)
    except docker.errors.ImageNotFound:
        return False, f"{target.tag} missing"
    try:
        base_id = client.images.get(BASE_IMAGE).id
    except docker.errors.ImageNotFound:
        return True, f"{target.tag} present (base image absent, cannot check freshness)"
    if (image.labels or {}).get(CONTEXT_LABEL) != context_hash(folder, _base_key(base_id, apt_snapshot())):
        return False, f"{target.tag} present but older than images/{target.name}"
    return True, f"{target.tag} current ({image.short_id})"
