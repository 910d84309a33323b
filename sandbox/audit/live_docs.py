"""What a live audit reads from the engine beyond `docker inspect` of a container: the host path
behind a `volume` mount, which of its networks are internal, and what its image was built from."""

from __future__ import annotations

from typing import Any

from sandbox.audit.exposure_rules import INTERNAL_KEY
from sandbox.audit.findings import Finding
from sandbox.audit.mount_rules import VOLUME_DEVICE
from sandbox.config.merge import agent_ids, effective_agent
from sandbox.config.models import Config
from sandbox.runtime.docker.images import provenance


def enrich(client: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """Annotate an inspect document with what the container rules need from other engine objects."""
    for mount in doc.get("Mounts") or []:
        if mount.get("Type") != "volume" or not mount.get("Name"):
            continue
        try:
            volume = client.api.inspect_volume(mount["Name"])
        except Exception:  # noqa: S112 - removed since: the container keeps only what it had
            continue
        options = volume.get("Options") or {}
        # `local` with type none / o bind is `mount --bind device`: a bind mount by another name
        binds = options.get("type") == "none" or "bind" in str(options.get("o") or "").split(",")
        if volume.get("Driver") == "local" and options.get("device") and binds:
            mount[VOLUME_DEVICE] = str(options["device"])
    internal = []
    for name in (doc.get("NetworkSettings") or {}).get("Networks") or {}:
        try:
            if client.api.inspect_network(name).get("Internal"):
                internal.append(name)
        except Exception:  # noqa: S112 - a network gone since counts as not internal
            continue
    doc[INTERNAL_KEY] = internal
    return doc


def image_findings(client: Any, config: Config) -> list[Finding]:
    """SBX-I001 (info): what each configured image was built from; SBX-I002 (low): not recorded."""
    images: set[str] = set()
    for agent_id in agent_ids(config):
        sandbox = effective_agent(config, agent_id).sandbox
        if sandbox.mode != "off":
            images.add(sandbox.docker.image)
            if sandbox.browser.enabled:
                images.add(sandbox.browser.image)
    out = []
    for image in sorted(images):
        try:
            labels = (client.api.inspect_image(image).get("Config") or {}).get("Labels") or {}
        except Exception:  # noqa: S112 - a missing image is doctor's finding, not provenance's
            continue
        found = provenance(labels)
        if "packages-sha256" in found:
            out.append(
                Finding(
                    "SBX-I001",
                    "info",
                    "image provenance",
                    "; ".join(f"{k} {v}" for k, v in found.items()),
                    "pin apt with SANDBOX_APT_SNAPSHOT and the base by digest to make the build reproducible",
                    f"image {image}",
                )
            )
        else:
            out.append(
                Finding(
                    "SBX-I002",
                    "low",
                    "image provenance not recorded",
                    "no base image id, apt pin or package list hash in its labels",
                    "rebuild it with `sandbox images build`",
                    f"image {image}",
                )
            )
    return out
