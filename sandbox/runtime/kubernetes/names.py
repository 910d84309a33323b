"""Names and labels on a cluster: namespaces per tenant, claims per workspace, label-safe values.

Kubernetes is stricter than Docker about names (RFC 1123 labels, 63 characters) and label
values (no `:` or `|`), and a session key has both. Names are therefore a readable slug plus a
hash of the full text, as container names are (runtime/naming.py), and the full texts go in
annotations, which take any string.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from sandbox.config.kubernetes import KubernetesSection
from sandbox.runtime.naming import short_hash, slug, tenant_scope

# the label and annotation prefix on a cluster: a DNS subdomain, as the API wants for keys
K8S_PREFIX = "agent-sandbox.io"
MANAGED_BY = ("app.kubernetes.io/managed-by", "agent-sandbox")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")


class K8sLabels:
    """Label keys on every object this orchestrator makes on a cluster (values label-safe)."""

    INSTANCE = f"{K8S_PREFIX}/instance"
    KIND = f"{K8S_PREFIX}/kind"  # exec | browser | egress-proxy | skill
    TENANT = f"{K8S_PREFIX}/tenant"
    AGENT = f"{K8S_PREFIX}/agent"
    SCOPE = f"{K8S_PREFIX}/scope"
    CONFIG_HASH = f"{K8S_PREFIX}/config-hash"
    POOL = f"{K8S_PREFIX}/pool"
    CLAIMED = f"{K8S_PREFIX}/claimed"  # "false" on an unclaimed pool Pod, the claimer's id once claimed
    # what NetworkPolicies select: every sandbox Pod, and those allowed to reach the egress proxy
    # a session's own Pod (a uid of its own): the sandbox name of the Pod whose sessions it serves
    USER_OF = f"{K8S_PREFIX}/user-of"
    SANDBOX = f"{K8S_PREFIX}/sandbox"
    EGRESS = f"{K8S_PREFIX}/egress"


class K8sAnnotations:
    """Full texts that are not label-safe (session keys carry `:`), kept beside the labels."""

    TENANT = f"{K8S_PREFIX}/tenant"
    SESSION = f"{K8S_PREFIX}/session"
    SCOPE_KEY = f"{K8S_PREFIX}/scope-key"
    CREATED_AT = f"{K8S_PREFIX}/created-at"
    # the sandbox name of the session a claimed pool Pod serves (a Pod cannot be renamed)
    SANDBOX_NAME = f"{K8S_PREFIX}/sandbox-name"
    # the websocket subprotocol the agent's link agreed (v5 or v4), written when a link opens:
    # what `explain` shows of a live Pod
    EXEC_PROTOCOL = f"{K8S_PREFIX}/exec-protocol"
    SKILL = f"{K8S_PREFIX}/skill"  # the skill a one-shot Pod runs (kubernetes/skill_pod.py)


def label_value(text: str) -> str:
    """`text` when it is a valid label value, else a readable slug with a hash of the text."""
    if len(text) <= 63 and LABEL_VALUE.fullmatch(text):
        return text
    return f"{slug(text, 40)}-{short_hash(text, 16)}"


def namespace_for(cfg: KubernetesSection, tenant: str) -> str:
    """The namespace of `tenant`'s sandboxes: the fixed `namespace`, else the template's.

    The template's part is a readable slug and a hash of the exact id, always: `acme` and
    `Acme`, or a tenant named after another's hashed form, never share a namespace.
    """
    if cfg.namespace is not None:
        return cfg.namespace
    room = 63 - len(cfg.namespace_template.replace("{tenant}", ""))
    digest = short_hash(f"tenant|{tenant}", 10)
    part = f"{slug(tenant, max(room - len(digest) - 1, 1))}-{digest}"
    return cfg.namespace_template.replace("{tenant}", part)


def shared_namespace_problem(cfg: KubernetesSection, tenants: list[str]) -> str | None:
    """Why a fixed `namespace` cannot serve these tenants (None: it can): one namespace has one
    quota, one role and one set of policies, so tenants in it would share them."""
    if cfg.namespace is not None and len(set(tenants)) > 1:
        return (
            f"runtime.kubernetes.namespace: one namespace ({cfg.namespace}) for {len(set(tenants))} tenants "
            "would give them one quota and one set of policies; use namespace_template (one per tenant)"
        )
    return None


def claim_name(tenant: str, owner: str) -> str:
    """The PersistentVolumeClaim of a workspace: one per tenant and owner (an agent's id, or
    `*` for the shared scope's), never a host path."""
    return f"ws-{slug(owner, 20)}-{short_hash(tenant_scope(tenant, 'workspace:' + owner), 24)}"


def policy_hash(policy: dict[str, Any]) -> str:
    """A short name for one egress policy: a tenant's agents with the same rules share a proxy,
    and a sandbox Pod's `egress` label names the proxy its NetworkPolicy lets it reach."""
    return hashlib.sha256(json.dumps(policy, sort_keys=True).encode()).hexdigest()[:12]
