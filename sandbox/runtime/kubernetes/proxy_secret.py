"""The egress proxy's Secret, written by the orchestrator: the resolved policy of one proxy (its
rules, the secrets' values, the upstream CA) as `policy.json` in `proxy-<hash>`, which only the
proxy's Deployment reads (tenant.py). The values are read where the orchestrator runs, as on
Docker (runtime/egress_secrets.py); they never enter a sandbox Pod.

The orchestrator never reads a Secret: it creates this one, and when it exists already it
patches it whole (the Role grants `create` on secrets, and `patch` only on the proxies' own
names). A sandbox holds a placeholder instead of each value: one per namespace, proxy and
secret, derived, so every replica writes the same one and every sandbox of that policy holds
the one its proxy knows. A placeholder is not a secret (each sandbox of the policy has it in its
environment; the proxy puts the value in only for its own clients and the secret's hosts).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sandbox.runtime.egress_secrets import resolve, upstream_ca_pem
from sandbox.runtime.kubernetes.names import MANAGED_BY, K8sAnnotations, K8sLabels, label_value

PROXY_KIND = "egress-proxy"


def secret_name(digest: str) -> str:
    """The Secret (and Deployment, Service) of the proxy of policy `digest`."""
    return f"proxy-{digest}"


def placeholders(namespace: str, digest: str, policy: dict[str, Any]) -> dict[str, str]:
    """`$NAME` -> the placeholder a sandbox of this proxy holds for each of its secrets."""
    out = {}
    for secret in policy.get("secrets", []):
        name = str(secret["name"])
        tag = hashlib.sha256(f"agent-sandbox placeholder|{namespace}|{digest}|{name}".encode()).hexdigest()[:24]
        out[name] = f"sbx-secret-{name.lower().replace('_', '-')}-{tag}"
    return out


def proxy_secret(tenant: str, namespace: str, digest: str, policy: dict[str, Any]) -> dict[str, Any]:
    """The Secret of one proxy, values resolved.

    Raises:
        SandboxUnavailable: a secret's value cannot be read (its variable unset, its file missing).
    """
    marks = placeholders(namespace, digest, policy)
    resolved = [{**s, "placeholder": marks[str(s["name"])]} for s in resolve(policy, secret_name(digest))]
    proxy_policy = {
        **policy,
        "identity": {"tenant": tenant, "namespace": namespace, "policy": digest},
        # who may connect is the NetworkPolicy's to say on a cluster (sbx-to-proxy-<hash>)
        "client_subnet": None,
        "secrets": resolved,
        "upstream_ca_pem": upstream_ca_pem(policy, secret_name(digest)),
        # the cluster's and the nodes' ranges are the NetworkPolicy's ipBlock exceptions
        "host_addresses": [],
    }
    return secret_object(
        secret_name(digest),
        namespace,
        tenant,
        digest,
        PROXY_KIND,
        {"policy.json": json.dumps(proxy_policy, sort_keys=True)},
    )


def secret_object(
    name: str, namespace: str, tenant: str, digest: str, kind: str, data: dict[str, str]
) -> dict[str, Any]:
    """A Secret of the proxy of policy `digest`, labelled as the orchestrator's (`kind`: what it holds)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                MANAGED_BY[0]: MANAGED_BY[1],
                K8sLabels.TENANT: label_value(tenant),
                K8sLabels.KIND: kind,
                K8sLabels.EGRESS: digest,
            },
            "annotations": {K8sAnnotations.TENANT: tenant},
        },
        "type": "Opaque",
        "stringData": data,
    }
