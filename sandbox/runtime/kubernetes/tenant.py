"""What an operator applies once per tenant: its namespace and everything that fences it in.

Pure: `sandbox k8s render` prints these, the backend checks they are there, and the tests
validate them against the API's schemas. Per tenant:

- a Namespace labelled for Pod Security admission (`restricted`, enforced, audited and warned
  at the pinned `pss_version`);
- a ServiceAccount for sandboxes that is never given a token;
- a ResourceQuota and a LimitRange derived from the tenant's quotas and its agents' limits;
- a Role and RoleBinding for the orchestrator's own service account: Pods, `pods/exec`, claims
  and the proxy's Secret in this namespace only, nothing cluster-wide;
- NetworkPolicies: every sandbox denied all traffic; egress sandboxes may reach only the proxy of
  their policy; each proxy reaches the internet only (cluster, private and metadata ranges out);
- one egress proxy (Deployment + Service) per distinct egress policy of the tenant's agents: a
  separate Pod, never a sidecar, which would share the sandbox's network namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandbox.config.kubernetes import KubernetesSection, quantity_bytes
from sandbox.config.merge import EffectiveAgent, agent_ids, effective_agent
from sandbox.config.models import Config, TenantConfig
from sandbox.errors import ConfigError
from sandbox.fs.quota import parse_size
from sandbox.runtime.browser_rules import browser_egress_policy
from sandbox.runtime.egress_proxy import PROXY_MEMORY, PROXY_PORT, proxy_command
from sandbox.runtime.kubernetes.agent_sandbox import ROLE_RULES
from sandbox.runtime.kubernetes.names import (
    MANAGED_BY,
    K8sAnnotations,
    K8sLabels,
    label_value,
    namespace_for,
    policy_hash,
    shared_namespace_problem,
)
from sandbox.runtime.kubernetes.pod import SANDBOX_SERVICE_ACCOUNT, mebibytes
from sandbox.runtime.kubernetes.proxy_ca import PROXY_CA_SCRIPT, ca_secret_name, decrypts, proxy_ca_volume
from sandbox.runtime.kubernetes.proxy_secret import PROXY_KIND, secret_name
from sandbox.runtime.spec import EGRESS_NETWORK, egress_policy

ORCHESTRATOR_ROLE = "agent-sandbox-orchestrator"
DENY_ALL = "sbx-deny-all"
# what a proxy may never reach: private, shared, link-local (cloud metadata) and loopback ranges,
# whatever the cluster's own CIDRs are (the proxy's own check refuses them too)
NOT_FROM_PROXY_V4 = ["10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"]
NOT_FROM_PROXY_V6 = ["::1/128", "fc00::/7", "fe80::/10"]


@dataclass(frozen=True)
class Orchestrator:
    """The service account the orchestrator runs as (bound to each tenant namespace's Role)."""

    namespace: str = "agent-sandbox"
    name: str = "agent-sandbox"


def tenant_agents(config: Config, tenant: str) -> list[EffectiveAgent]:
    """The tenant's sandboxed agents, in config order."""
    agents = [effective_agent(config, agent_id) for agent_id in agent_ids(config)]
    return [a for a in agents if a.tenant == tenant and a.sandbox.mode != "off"]


def _meta(name: str, namespace: str | None, tenant: str, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace is not None else {})}
    meta["labels"] = {MANAGED_BY[0]: MANAGED_BY[1], K8sLabels.TENANT: label_value(tenant), **labels}
    meta["annotations"] = {K8sAnnotations.TENANT: tenant}
    return meta


def namespace_object(cfg: KubernetesSection, tenant: str) -> dict[str, Any]:
    """The tenant's namespace, enforcing `restricted` at the pinned version."""
    meta = _meta(namespace_for(cfg, tenant), None, tenant)
    for mode in ("enforce", "audit", "warn"):
        meta["labels"][f"pod-security.kubernetes.io/{mode}"] = "restricted"
        meta["labels"][f"pod-security.kubernetes.io/{mode}-version"] = cfg.pss_version
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def quota_objects(config: Config, tenant: TenantConfig, namespace: str) -> list[dict[str, Any]]:
    """A ResourceQuota and a LimitRange from the tenant's quotas and its agents' limits.

    `max_sandboxes` caps sandbox Pods (the proxies come on top); each Pod may use at most the
    largest limits of the tenant's agents, and all of them together that many times over.
    `max_workspace_bytes` caps the storage all claims request.
    """
    k8s = config.runtime.kubernetes
    agents = tenant_agents(config, tenant.id)
    cpu_m = max((int(a.sandbox.docker.cpus * 1000) for a in agents), default=1000)
    memory = max((parse_size(a.sandbox.docker.memory) for a in agents), default=parse_size("1g"))
    proxies = len(egress_policies(agents))
    hard: dict[str, str] = {"persistentvolumeclaims": str(len(agents) + 1)}
    if tenant.quotas.max_sandboxes:
        pods = tenant.quotas.max_sandboxes
        hard["pods"] = str(pods + proxies)
        scratch = quantity_bytes(k8s.scratch_size)
        hard["limits.cpu"] = f"{cpu_m * pods + 1000 * proxies}m"
        hard["limits.memory"] = mebibytes(str(memory * pods + parse_size(PROXY_MEMORY) * proxies))
        hard["limits.ephemeral-storage"] = mebibytes(str(scratch * pods + parse_size("64m") * proxies))
    if parse_size(tenant.quotas.max_workspace_bytes):
        hard["requests.storage"] = mebibytes(tenant.quotas.max_workspace_bytes)
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _meta("sbx-quota", namespace, tenant.id),
        "spec": {"hard": hard},
    }
    most = {"cpu": f"{max(cpu_m, 1000)}m", "memory": mebibytes(str(max(memory, parse_size(PROXY_MEMORY))))}
    limits = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": _meta("sbx-limits", namespace, tenant.id),
        "spec": {
            "limits": [
                {"type": "Container", "max": most},
                {"type": "PersistentVolumeClaim", "max": {"storage": k8s.workspace_size}},
            ]
        },
    }
    return [quota, limits]


def access_objects(
    tenant: str,
    namespace: str,
    orchestrator: Orchestrator,
    provider: str = "pods",
    proxies: list[str] | None = None,
    cas: list[str] | None = None,
    browsers: bool = False,
    skills: bool = False,
) -> list[dict[str, Any]]:
    """The sandboxes' token-less service account, and the orchestrator's Role in this namespace
    (with the agent-sandbox objects' rules under `provider: agent-sandbox`, the writing of the
    `proxies`' Secrets, and the reading of their `cas` Secrets by name)."""
    # only what the backend does: no deleting claims (a stolen token must not wipe workspaces).
    # `patch` and `watch` on pods are the warm pool's (kubernetes/pool.py: a claim is one label
    # patch, a watch refills); patch adds no power over a Pod that create and delete do not give
    # already. Secrets are never read: the proxies' are created, and patched only by their names
    # (kubernetes/proxy_secret.py)
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        # the exec websocket is a GET that needs `create` too (kubernetes#134577)
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["get"]},
    ]
    if proxies:
        rules += [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["patch"], "resourceNames": sorted(proxies)},
        ]
    if browsers:  # a browser's DevTools port, reached through the API server (kubernetes/portforward.py)
        rules.append({"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get", "create"]})
    if proxies:  # the proxies' request lines, attributed to sandboxes (kubernetes/egress_log.py)
        rules.append({"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]})
    if cas:  # a CA another replica made is read back, by name (kubernetes/proxy_ca.py)
        rules.append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": sorted(cas)})
    if skills:  # each skill's folder, as a ConfigMap named after its content, made once (kubernetes/skill_pod.py)
        rules.append({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]})
    if provider == "agent-sandbox":
        rules += ROLE_RULES
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(SANDBOX_SERVICE_ACCOUNT, namespace, tenant),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(ORCHESTRATOR_ROLE, namespace, tenant),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(ORCHESTRATOR_ROLE, namespace, tenant),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ORCHESTRATOR_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": orchestrator.name, "namespace": orchestrator.namespace}],
        },
    ]


def egress_policies(agents: list[EffectiveAgent]) -> dict[str, dict[str, Any]]:
    """hash -> egress policy, for each distinct policy of these agents' `network: egress`, and of
    their browsers (the same allowlist without the secrets: a proxy of its own)."""
    found: dict[str, dict[str, Any]] = {}
    for agent in agents:
        if agent.sandbox.docker.network == EGRESS_NETWORK:
            policy = egress_policy(agent)
            found[policy_hash(policy)] = policy
            if agent.sandbox.browser.enabled and (browser := browser_egress_policy(agent)) is not None:
                found[policy_hash(browser)] = browser
    return found


def network_objects(tenant: str, namespace: str, policies: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Deny-all for every sandbox; per egress policy, the way to its proxy and the proxy's way out."""
    # every Pod of the namespace, labelled or not: a Pod is fenced in unless a policy below lets it out
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _meta(DENY_ALL, namespace, tenant),
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        }
    ]
    for digest, policy in sorted(policies.items()):
        proxy = {"matchLabels": {K8sLabels.KIND: PROXY_KIND, K8sLabels.EGRESS: digest}}
        clients = {"matchLabels": {K8sLabels.SANDBOX: "true", K8sLabels.EGRESS: digest}}
        tcp = [{"protocol": "TCP", "port": PROXY_PORT}]
        objects.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": _meta(f"sbx-to-proxy-{digest}", namespace, tenant),
                "spec": {
                    "podSelector": clients,
                    "policyTypes": ["Egress"],
                    "egress": [{"to": [{"podSelector": proxy}], "ports": tcp}],
                },
            }
        )
        out_ports = [{"protocol": "TCP", "port": port} for port in policy["ports"]]
        dns = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
        objects.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": _meta(f"proxy-{digest}", namespace, tenant),
                "spec": {
                    "podSelector": proxy,
                    "policyTypes": ["Ingress", "Egress"],
                    "ingress": [{"from": [{"podSelector": clients}], "ports": tcp}],
                    "egress": [
                        {
                            "to": [
                                {"ipBlock": {"cidr": "0.0.0.0/0", "except": NOT_FROM_PROXY_V4}},
                                {"ipBlock": {"cidr": "::/0", "except": NOT_FROM_PROXY_V6}},
                            ],
                            "ports": out_ports,
                        },
                        # the proxy resolves the hosts it is allowed (the cluster's DNS only)
                        {
                            "to": [
                                {
                                    "namespaceSelector": {
                                        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                                    },
                                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                                }
                            ],
                            "ports": dns,
                        },
                    ],
                },
            }
        )
    return objects


def proxy_objects(
    tenant: str, namespace: str, digest: str, policy: dict[str, Any], pull_policy: str = "IfNotPresent"
) -> list[dict[str, Any]]:
    """One egress proxy: a restricted Deployment and its Service. Its resolved policy (with the
    secrets' values) is the Secret `proxy-<hash>`, key policy.json, which only this Deployment
    reads; the orchestrator writes it (kubernetes/proxy_secret.py)."""
    name = secret_name(digest)
    labels = {K8sLabels.KIND: PROXY_KIND, K8sLabels.EGRESS: digest}
    limits = {"cpu": "1000m", "memory": mebibytes(PROXY_MEMORY), "ephemeral-storage": "64Mi"}
    pod: dict[str, Any] = {
        "metadata": {"labels": {MANAGED_BY[0]: MANAGED_BY[1], **labels}},
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "proxy",
                    "image": policy["image"],
                    # as the sandboxes' (runtime.kubernetes.image_pull_policy): an image only loaded
                    # on the nodes (kind load) would never start under `:latest`'s default, Always
                    "imagePullPolicy": pull_policy,
                    "command": ["/usr/bin/tini", "--", *proxy_command(policy)],
                    "env": [
                        {"name": "HOME", "value": "/tmp"},
                        {
                            "name": "EGRESS_POLICY",
                            "valueFrom": {"secretKeyRef": {"name": name, "key": "policy.json"}},
                        },
                    ],
                    "ports": [{"containerPort": PROXY_PORT, "protocol": "TCP"}],
                    "resources": {"requests": dict(limits), "limits": dict(limits)},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "privileged": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}],
        },
    }
    if decrypts(policy):  # its CA, the one its sandboxes trust (kubernetes/proxy_ca.py)
        volume, mount = proxy_ca_volume(digest)
        spec: dict[str, Any] = pod["spec"]
        spec["securityContext"]["fsGroup"] = 1000  # the key is readable by the proxy's group only
        spec["volumes"].append(volume)
        proxy = spec["containers"][0]
        proxy["volumeMounts"].append(mount)
        proxy["command"] = ["/usr/bin/tini", "--", "/bin/sh", "-c", PROXY_CA_SCRIPT, "sh", *proxy_command(policy)]
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(name, namespace, tenant, **labels),
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": pod},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(name, namespace, tenant, **labels),
            "spec": {"selector": labels, "ports": [{"name": "proxy", "port": PROXY_PORT, "protocol": "TCP"}]},
        },
    ]


def tenant_objects(config: Config, tenant: TenantConfig, orchestrator: Orchestrator) -> list[dict[str, Any]]:
    """Everything an operator applies once for `tenant`, in the order to apply it.

    Raises:
        ConfigError: a fixed namespace named for more than one tenant.
    """
    k8s = config.runtime.kubernetes
    if problem := shared_namespace_problem(k8s, [t.id for t in config.tenants]):
        raise ConfigError([problem])
    namespace = namespace_for(k8s, tenant.id)
    policies = egress_policies(tenant_agents(config, tenant.id))
    objects = [namespace_object(k8s, tenant.id)]
    cas = [ca_secret_name(d) for d, p in policies.items() if decrypts(p)]
    browsers = any(a.sandbox.browser.enabled for a in tenant_agents(config, tenant.id))
    proxies = [secret_name(d) for d in policies]
    skills = bool(config.skills.dirs)
    objects += access_objects(tenant.id, namespace, orchestrator, k8s.provider, proxies, cas, browsers, skills)
    objects += quota_objects(config, tenant, namespace)
    objects += network_objects(tenant.id, namespace, policies)
    for digest, policy in sorted(policies.items()):
        objects += proxy_objects(tenant.id, namespace, digest, policy, k8s.image_pull_policy)
    return objects
