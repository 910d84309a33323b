"""Which path a sandbox's commands take, read from its image's labels (no engine client here:
`explain` imports it, and stays light)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sandbox.runtime.naming import LABEL_PREFIX

PROTOCOL = 1  # the resident agent's protocol this orchestrator speaks (runtime/agent/frames.py)
AGENT_LABEL = f"{LABEL_PREFIX}.resident-agent"  # not `.agent`: containers carry that one (the agent id)
AGENT_PROTOCOL_LABEL = f"{LABEL_PREFIX}.resident-agent-protocol"
AGENT_LINK_LABEL = f"{LABEL_PREFIX}.resident-agent-link"  # "fifo": the agent takes `--link`


@dataclass(frozen=True)
class ExecPath:
    """How commands reach a sandbox: `agent` (the resident agent) or `docker exec`, and why."""

    kind: str
    reason: str
    agent_path: str | None = None
    link: bool = False  # the agent can move its frames to FIFOs (runtime/agent/fifo_link.py)

    def describe(self) -> str:
        """One line for explain and doctor."""
        return f"{self.kind} ({self.reason})"


def path_from_labels(labels: Mapping[str, str] | None, mode: str) -> ExecPath:
    """The path an image's labels allow under `docker.agent` = `mode`."""
    if mode == "off":
        return ExecPath("docker exec", "docker.agent is off")
    found = labels or {}
    path = found.get(AGENT_LABEL)
    if not path:
        return ExecPath("docker exec", f"the image has no resident agent (label {AGENT_LABEL})")
    if found.get(AGENT_PROTOCOL_LABEL) != str(PROTOCOL):
        return ExecPath(
            "docker exec",
            f"the image's agent speaks protocol {found.get(AGENT_PROTOCOL_LABEL)!r}, this orchestrator {PROTOCOL}; "
            "rebuild it with `sandbox images build`",
        )
    return ExecPath("agent", f"resident agent {path}", path, link=found.get(AGENT_LINK_LABEL) == "fifo")
