"""The egress proxy's Secret on a cluster, written by the backend: the resolved policy with the
secrets' values, created or patched whole, never read (the fake API refuses every read of a
Secret, as the Role does); the sandbox Pod holds placeholders only; the Role grants create, and
patch only on the proxies' own Secrets. Against the fake API with objects only (no Pod runs)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from sandbox.config import load_config_text
from sandbox.config.merge import effective_agent
from sandbox.config.models import Config
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import namespace_for, policy_hash
from sandbox.runtime.kubernetes.proxy_secret import placeholders, proxy_secret
from sandbox.runtime.kubernetes.tenant import Orchestrator, tenant_objects
from sandbox.runtime.spec import SandboxSpec, egress_policy, spec_from_config
from tests.k8s_fake_cluster import FakeCluster

pytestmark = pytest.mark.anyio
VALUE = "s3cret-value-never-in-a-pod"


def _config(tmp_path: Path) -> Config:
    return load_config_text(
        f"""
state_dir: {tmp_path / "state"}
instance: sec1
runtime:
  backend: kubernetes
  kubernetes: {{seccomp: "Localhost:agent-sandbox/strict.json"}}
tenants: [{{id: acme}}, {{id: quiet}}]
agents:
  list:
    - id: web
      tenant: acme
      workspace: {tmp_path / "ws-web"}
      sandbox:
        mode: all
        scope: session
        workspace_access: none
        docker: {{network: egress}}
        egress:
          allow: [api.example.com]
          secrets:
            API_TOKEN: {{value_from: "env:SBX_TEST_API_TOKEN", hosts: [api.example.com]}}
    - {{id: plain, tenant: quiet, workspace: {tmp_path / "ws-plain"}}}
""",
        base_dir=tmp_path,
    )


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[FakeCluster]:
    config = _config(tmp_path)
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    digest = policy_hash(egress_policy(effective_agent(config, "web")))
    forbidden = {("get", "secrets"), ("list", "secrets")}
    granted = {("get", "secrets", f"proxy-{digest}-ca")}  # the CA Secret only, by name (as the Role)
    async with FakeCluster(namespaces={namespace}, forbidden=forbidden, granted=granted) as fake:
        service = {"metadata": {"name": f"proxy-{digest}", "namespace": namespace}, "spec": {"clusterIP": "10.96.0.9"}}
        fake.objects[("services", namespace, f"proxy-{digest}")] = service
        yield fake


def _spec(config: Config, session: str) -> SandboxSpec:
    return spec_from_config(config, effective_agent(config, "web"), session, "sec1")


def _policy_json(cluster: FakeCluster) -> dict[str, Any]:
    (secret,) = [
        obj for (kind, _, _), obj in cluster.objects.items() if kind == "secrets" and "policy.json" in obj["data"]
    ]
    parsed: dict[str, Any] = json.loads(base64.b64decode(secret["data"]["policy.json"]))
    return parsed


async def test_an_egress_sandbox_writes_its_proxys_secret_and_holds_only_a_placeholder(
    tmp_path: Path, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first egress Pod writes the Secret (one create, no read); the value is in the Secret
    and nowhere in the Pod, whose `$API_TOKEN` is the placeholder the proxy knows."""
    monkeypatch.setenv("SBX_TEST_API_TOKEN", VALUE)
    config = _config(tmp_path)
    backend = KubernetesBackend(config, api=cluster.api())
    try:
        box = await backend.ensure(_spec(config, "agent:web:s1"))
        await backend.ensure(_spec(config, "agent:web:s2"))  # the same proxy: written once
    finally:
        await backend.aclose()
    policy = _policy_json(cluster)
    (secret,) = policy["secrets"]
    secret_name = f"proxy-{policy['identity']['policy']}"
    assert secret["value"] == VALUE and secret["name"] == "API_TOKEN"
    assert policy["identity"]["tenant"] == "acme" and policy["client_subnet"] is None
    pod = next(obj for (kind, _, name), obj in cluster.objects.items() if kind == "pods" and name == box.id)
    assert VALUE not in json.dumps(pod)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["API_TOKEN"] == secret["placeholder"]
    secret_requests = [(m, p.rsplit("/", 1)[-1]) for m, p in cluster.requests if "/secrets" in p]
    # the CA looked for (404) and created (proxy_ca.py), then the policy's Secret created; the one
    # with the values is never read
    assert secret_requests == [("GET", f"{secret_name}-ca"), ("POST", "secrets"), ("POST", "secrets")]


async def test_a_restarted_orchestrator_patches_the_secret_whole_without_reading_it(
    tmp_path: Path, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Secret exists (another replica, an earlier run): create answers 409 and a patch puts
    the values read now (a rotated one) in; nothing ever reads it."""
    config = _config(tmp_path)
    for value, session in ((VALUE, "agent:web:a"), ("rotated-value", "agent:web:b")):
        monkeypatch.setenv("SBX_TEST_API_TOKEN", value)
        backend = KubernetesBackend(config, api=cluster.api())
        try:
            await backend.ensure(_spec(config, session))
        finally:
            await backend.aclose()
    assert _policy_json(cluster)["secrets"][0]["value"] == "rotated-value"
    to_policy = [m for m, p in cluster.requests if "/secrets" in p and not p.endswith("-ca")]
    # creates (the CA's and the policy's, both POST to the collection), then the patch; no GET
    assert to_policy == ["POST", "POST", "POST", "PATCH"]
    assert not [p for m, p in cluster.requests if m == "GET" and "/secrets/" in p and not p.endswith("-ca")]


async def test_a_secret_that_cannot_be_read_stops_before_anything_is_written(
    tmp_path: Path, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unset variable is an error naming the secret; no Secret with values and no Pod are made
    (the proxy's CA may be: it holds no value, and the next try uses it)."""
    monkeypatch.delenv("SBX_TEST_API_TOKEN", raising=False)
    config = _config(tmp_path)
    backend = KubernetesBackend(config, api=cluster.api())
    try:
        with pytest.raises(SandboxUnavailable, match="API_TOKEN"):
            await backend.ensure(_spec(config, "agent:web:s1"))
    finally:
        await backend.aclose()
    assert [k for k in cluster.objects if k[0] == "pods" or (k[0] == "secrets" and not k[2].endswith("-ca"))] == []


@pytest.mark.parametrize("version", ["1.33", "1.37"])
def test_the_secret_passes_the_strict_schema_and_placeholders_are_stable(
    tmp_path: Path, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Secret validates strictly; a placeholder is the same for every replica and differs
    per namespace and proxy."""
    monkeypatch.setenv("SBX_TEST_API_TOKEN", VALUE)
    policy = egress_policy(effective_agent(_config(tmp_path), "web"))
    kubernetes_validate.validate(proxy_secret("acme", "ns1", "abc", policy), version, strict=True)
    assert placeholders("ns1", "abc", policy) == placeholders("ns1", "abc", policy)
    assert placeholders("ns1", "abc", policy) != placeholders("ns2", "abc", policy)
    assert placeholders("ns1", "abc", policy) != placeholders("ns1", "abd", policy)


def test_the_role_may_create_secrets_and_patch_only_the_proxies_own(tmp_path: Path) -> None:
    """Least privilege: create, and patch by name; get only the proxies' CA Secrets, by name (never
    the policy's, which holds the values); never list or watch; nothing for a tenant without egress."""
    config = _config(tmp_path)
    digest = policy_hash(egress_policy(effective_agent(config, "web")))
    for tenant, expected in (("acme", [f"proxy-{digest}"]), ("quiet", None)):
        objects = tenant_objects(config, next(t for t in config.tenants if t.id == tenant), Orchestrator())
        role = next(o for o in objects if o["kind"] == "Role")
        rules = [r for r in role["rules"] if "secrets" in r["resources"]]
        if expected is None:
            assert rules == []
            continue
        assert {v for r in rules for v in r["verbs"]} == {"create", "patch", "get"}
        patch = next(r for r in rules if "patch" in r["verbs"])
        assert patch["resourceNames"] == expected and patch["verbs"] == ["patch"]
        get = next(r for r in rules if "get" in r["verbs"])
        assert get["verbs"] == ["get"] and get["resourceNames"] == [f"{name}-ca" for name in expected]
