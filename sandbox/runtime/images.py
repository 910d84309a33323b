"""`sandbox images build`: the exec and browser images from images/, without any registry."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors

from sandbox.errors import SandboxUnavailable
from sandbox.runtime.docker_errors import mapped
from sandbox.runtime.naming import LABEL_PREFIX

BASE_IMAGE = "debian:bookworm-slim"
CONTEXT_LABEL = f"{LABEL_PREFIX}.context-hash"


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
    return Path(__file__).resolve().parents[2] / "images"


def context_hash(folder: Path, base_id: str) -> str:
    """Hash of every file in a build context plus the base image id."""
    digest = hashlib.sha256(base_id.encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_base(offline: bool, log: Callable[[str], None]) -> None:
    """Make sure the base image exists: present, pulled, or debootstrapped (images/bootstrap)."""
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
    with mapped("build image"):
        base_id = client.images.get(BASE_IMAGE).id
        wanted = context_hash(folder, base_id)
        try:
            existing = client.images.get(target.tag)
            if not force and (existing.labels or {}).get(CONTEXT_LABEL) == wanted:
                log(f"{target.tag}: up to date ({existing.short_id})")
                return str(existing.id)
        except docker.errors.ImageNotFound:
            pass
        log(f"{target.tag}: building from {folder}")
        image_id = ""
        for chunk in client.api.build(
            path=str(folder),
            tag=target.tag,
            labels={CONTEXT_LABEL: wanted},
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
        log(f"{target.tag}: built {image_id[:19]}")
        return image_id


def build_all(
    client: Any,
    targets: list[ImageTarget],
    log: Callable[[str], None],
    *,
    offline: bool = False,
    force: bool = False,
) -> dict[str, str]:
    """Provide the base, then build every target; return tag -> image id."""
    ensure_base(offline, log)
    return {t.tag: build_image(client, t, log, force=force) for t in targets}


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
    if (image.labels or {}).get(CONTEXT_LABEL) != context_hash(folder, base_id):
        return False, f"{target.tag} present but older than images/{target.name}"
    return True, f"{target.tag} current ({image.short_id})"
