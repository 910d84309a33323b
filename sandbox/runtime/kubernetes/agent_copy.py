"""The resident agent for sandbox images that lack it: an init container of `agent_image` (one
that carries the agent, as sandbox-exec does) copies it into an emptyDir, which the sandbox
container mounts read-only. Nothing in the sandbox can change the agent it is then driven by;
the copy runs restricted, like every container of the Pod.
"""

from __future__ import annotations

from typing import Any

from sandbox.config.kubernetes import KubernetesSection
from sandbox.runtime.spec import SandboxSpec

# where the project's sandbox images carry the agent (images/sandbox/Dockerfile)
AGENT_PATH = "/usr/local/lib/sandbox-agent/agent.py"
AGENT_MOUNT = "/opt/sandbox-agent"  # the emptyDir, in the copy step and (read-only) in the sandbox
AGENT_VOLUME = "agent"


def copied(spec: SandboxSpec, cfg: KubernetesSection) -> bool:
    """Whether `spec`'s Pod gets the agent copied in (its image is named as lacking it)."""
    return cfg.agent_image is not None and spec.image in cfg.images_without_agent


def agent_path(image: str, cfg: KubernetesSection) -> str:
    """Where the agent is in a sandbox container of `image`."""
    copy = cfg.agent_image is not None and image in cfg.images_without_agent
    return f"{AGENT_MOUNT}/agent.py" if copy else AGENT_PATH


def copy_step(cfg: KubernetesSection, resources: dict[str, str], security: dict[str, Any]) -> dict[str, Any]:
    """The init container that copies the agent (`security`: the sandbox container's own)."""
    assert cfg.agent_image is not None
    return {
        "name": "agent",
        "image": cfg.agent_image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["/bin/cp", AGENT_PATH, f"{AGENT_MOUNT}/agent.py"],
        "workingDir": "/",
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": security,
        "volumeMounts": [{"name": AGENT_VOLUME, "mountPath": AGENT_MOUNT}],
    }


def agent_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the volume, the sandbox container's read-only mount of it)."""
    volume = {"name": AGENT_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}
    return volume, {"name": AGENT_VOLUME, "mountPath": AGENT_MOUNT, "readOnly": True}
