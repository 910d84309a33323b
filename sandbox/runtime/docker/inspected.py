"""Containers as the engine describes them (`docker inspect`, the container list), in the neutral
shapes: SandboxInfo for the inventory (labels and state), SandboxFacts for a person checking one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandbox.runtime.naming import Labels
from sandbox.runtime.protocol import SandboxFacts, SandboxInfo
from sandbox.runtime.spec import Mount


def info_from_container(attrs: Mapping[str, Any]) -> SandboxInfo:
    """Build a SandboxInfo from `docker inspect` / list attributes."""
    labels = attrs.get("Config", {}).get("Labels") or attrs.get("Labels") or {}
    name = (attrs.get("Name") or (attrs.get("Names") or ["?"])[0]).lstrip("/")
    state = attrs.get("State")
    status = state.get("Status", "?") if isinstance(state, dict) else str(state or "?")
    return SandboxInfo(
        id=attrs.get("Id", ""),
        name=name,
        kind=labels.get(Labels.KIND, ""),
        instance=labels.get(Labels.INSTANCE, ""),
        tenant=labels.get(Labels.TENANT, ""),
        agent=labels.get(Labels.AGENT, ""),
        scope=labels.get(Labels.SCOPE, ""),
        scope_key=labels.get(Labels.SCOPE_KEY, ""),
        session=labels.get(Labels.SESSION, ""),
        config_hash=labels.get(Labels.CONFIG_HASH, ""),
        created_at=labels.get(Labels.CREATED_AT, ""),
        status=status,
        image=attrs.get("Config", {}).get("Image") or attrs.get("Image", ""),
        labels=dict(labels),
    )


def facts_from_container(attrs: Mapping[str, Any]) -> SandboxFacts:
    """The facts of one container from its `docker inspect` attributes."""
    host = attrs["HostConfig"]
    return SandboxFacts(
        name=attrs["Name"].lstrip("/"),
        id=attrs["Id"],
        image=attrs["Config"]["Image"],
        user=attrs["Config"]["User"],
        network=host["NetworkMode"],
        cap_drop=tuple(host["CapDrop"] or ()),
        security_opt=tuple(host["SecurityOpt"] or ()),
        read_only_root=host["ReadonlyRootfs"],
        pids_limit=host["PidsLimit"],
        memory=host["Memory"],
        nano_cpus=host["NanoCpus"],
        init=host["Init"],
        mounts=tuple(
            Mount(m["Source"], m["Destination"], not m["RW"], "docker inspect", volume=m.get("Type") == "volume")
            for m in attrs["Mounts"]
        ),
    )
