"""The `docker inspect` a sandbox of the config would have, so the container rules judge the
config exactly as they judge a live container (what live_docs.py adds to a live one's)."""

from __future__ import annotations

from typing import Any

from sandbox.audit.exposure_rules import INTERNAL_KEY
from sandbox.config.merge import effective_agent
from sandbox.config.models import Config
from sandbox.runtime.docker.create import create_kwargs
from sandbox.runtime.docker.egress import names as egress_names
from sandbox.runtime.spec import spec_from_config


def inspect_of(config: Config, agent_id: str, session: str) -> dict[str, Any]:
    """The `docker inspect` a sandbox of this agent would have (so container rules apply to config)."""
    agent = effective_agent(config, agent_id)
    spec = spec_from_config(config, agent, session, "audit")
    kw = create_kwargs(spec)
    extra: dict[str, Any] = {}
    if spec.egress is not None:
        # the sandbox would sit on an internal network of its own, beside its proxy
        kw["network_mode"] = egress_names(spec.name).network
        extra[INTERNAL_KEY] = [kw["network_mode"]]
    return {
        **extra,
        "Name": "/" + spec.name,
        "Config": {
            "User": kw["user"],
            "Image": kw["image"],
            "Labels": spec.labels(),
            "Env": [f"{k}={v}" for k, v in kw["environment"].items()],
        },
        "HostConfig": {
            "Privileged": False,
            "CapDrop": kw["cap_drop"],
            "CapAdd": kw.get("cap_add"),
            "SecurityOpt": kw["security_opt"],
            "NetworkMode": kw["network_mode"],
            "Memory": kw["mem_limit"],
            "MemorySwap": kw["memswap_limit"],
            "NanoCpus": kw["nano_cpus"],
            "PidsLimit": kw["pids_limit"],
            "ReadonlyRootfs": kw["read_only"],
            "Tmpfs": kw["tmpfs"],
            "RestartPolicy": kw["restart_policy"],
            "PortBindings": {},
            "Annotations": kw.get("annotations"),
        },
        "Mounts": [
            {
                "Type": "bind",
                "Source": m.source,
                "Destination": m.target,
                "RW": not m.read_only,
                "Propagation": "rprivate",
                "Origin": m.origin,
            }
            for m in spec.engine_mounts
        ],
    }
