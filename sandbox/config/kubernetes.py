"""`runtime.kubernetes`: how sandboxes are made on a Kubernetes cluster (`runtime.backend: kubernetes`).

Only the settings: the objects they become are rendered in sandbox/runtime/kubernetes/. Every
name a setting gives (namespace, classes, secrets) is checked here against the rules the API
server applies, so a typo is a load error naming its key, not a 422 at the first session.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from sandbox.config.base import ConfigPath, StrictModel

# RFC 1123 label (namespaces, claim names) and subdomain (classes, secrets): the API's own rules
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"  # and <= 253 (max_length)
# a label key (optional DNS-subdomain prefix, then a name) and value, for node selectors
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"


def _quantity(value: object) -> object:
    """A size in this config's form (`10g`, `512m`) as a Kubernetes quantity (`10Gi`, `512Mi`)."""
    text = str(value).strip() if isinstance(value, str | int) else value
    if not isinstance(text, str):
        return value
    match = re.fullmatch(r"(\d+)([kmgt]?)(i?b?)?", text, flags=re.IGNORECASE)
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"a size above 0 such as 10g, 512m or 10Gi (got {value!r})")
    unit = match.group(2).lower()
    return match.group(1) + ({"": "", "k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti"}[unit])


Quantity = Annotated[str, BeforeValidator(_quantity)]
_BINARY = {"": 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}


def quantity_bytes(quantity: str) -> int:
    """Bytes of a quantity this module made (`10Gi` -> 10737418240)."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", quantity)
    if match is None:
        raise ValueError(f"not a binary quantity: {quantity!r}")
    return int(match.group(1)) * _BINARY[match.group(2) or ""]


def _seccomp(value: object) -> object:
    if not isinstance(value, str):
        return value
    if value == "RuntimeDefault" or re.fullmatch(r"Localhost:[A-Za-z0-9._/-]+\.json", value):
        if ".." in value.split("/"):
            raise ValueError("a Localhost profile path stays inside the kubelet's seccomp folder (no '..')")
        return value
    raise ValueError(
        "RuntimeDefault, or Localhost:<path>.json for a profile the operator installed under the "
        f"kubelet's seccomp folder (got {value!r}); Unconfined is not allowed under restricted"
    )


class Toleration(StrictModel):
    """One toleration of the sandbox Pods (`runtime.kubernetes.tolerations[]`)."""

    key: Annotated[str, Field(pattern=LABEL_KEY)] | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: Annotated[str, Field(pattern=LABEL_VALUE)] | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds applies only to effect NoExecute")
        return self


class KubernetesSection(StrictModel):
    """`runtime.kubernetes`: the cluster, the namespaces, and what every sandbox Pod is given."""

    # where the API is: a kubeconfig file (and context), or the service account of the Pod the
    # orchestrator runs in; neither: $KUBECONFIG, then ~/.kube/config
    kubeconfig: ConfigPath | None = None
    context: str | None = Field(None, min_length=1, max_length=253)
    in_cluster: bool = False
    # one namespace for every tenant, or one per tenant made from the template ({tenant})
    namespace: Annotated[str, Field(pattern=DNS_LABEL)] | None = None
    namespace_template: str = "sbx-{tenant}"
    # `pods`: Pods this project makes and pools; `agent-sandbox`: kubernetes-sigs/agent-sandbox's
    # SandboxTemplate / SandboxWarmPool / SandboxClaim objects, driven through the API
    provider: Literal["pods", "agent-sandbox"] = "pods"
    runtime_class_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = None
    storage_class: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = None
    # a ReadWriteMany class: what shared-scope workspaces need (one claim, many Pods)
    shared_storage_class: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = None
    workspace_size: Quantity = "10Gi"
    scratch_size: Quantity = "1Gi"
    seccomp: Annotated[str, BeforeValidator(_seccomp)] = "RuntimeDefault"
    image_pull_policy: Literal["IfNotPresent", "Never", "Always"] = "IfNotPresent"
    image_pull_secrets: list[Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)]] = []
    node_selector: dict[Annotated[str, Field(pattern=LABEL_KEY)], Annotated[str, Field(pattern=LABEL_VALUE)]] = {}
    tolerations: list[Toleration] = []
    # the Pod Security Standards version the namespaces enforce (pinned; `latest` would move)
    pss_version: str = Field("v1.33", pattern=r"^v1\.(2[5-9]|3[0-7])$")
    # the agent's ping over the exec stream: under the kubelet's idle cut (4 h default, 5 min by CIS)
    exec_heartbeat_s: float = Field(30.0, gt=0, le=240)
    pod_ready_timeout_s: float = Field(120.0, gt=0, le=3600)
    # sandbox images that lack the resident agent get it from `agent_image` (one that carries
    # /usr/local/lib/sandbox-agent/agent.py, as sandbox-exec does): an init container copies it
    # into an emptyDir the sandbox mounts read-only. The sandbox image still needs python3
    agent_image: str | None = Field(None, min_length=1, max_length=512, pattern=r"^\S+$")
    images_without_agent: list[Annotated[str, Field(min_length=1, max_length=512, pattern=r"^\S+$")]] = []

    @model_validator(mode="after")
    def _one_way_to_the_api(self) -> KubernetesSection:
        if self.images_without_agent and self.agent_image is None:
            raise ValueError("images_without_agent needs agent_image: the image the agent is copied from")
        if self.in_cluster and (self.kubeconfig is not None or self.context is not None):
            raise ValueError("in_cluster uses the Pod's service account: leave kubeconfig and context unset")
        if "{tenant}" not in self.namespace_template:
            raise ValueError(f"namespace_template must contain {{tenant}} (got {self.namespace_template!r})")
        probe = self.namespace_template.replace("{tenant}", "t")
        if re.fullmatch(DNS_LABEL, probe) is None or len(self.namespace_template.replace("{tenant}", "")) > 40:
            raise ValueError(
                "namespace_template must make a DNS label (lowercase letters, digits, '-') with room "
                f"for a tenant of 22 characters (got {self.namespace_template!r})"
            )
        return self
