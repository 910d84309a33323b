"""The egress proxy's CA on a cluster (kubernetes/proxy_ca.py): made once by whichever replica
needs it first, read back by name by every other, carried into each sandbox of that proxy by an
init step onto a read-only bundle, and loaded by the proxy from its Secret. Against the fake API
with objects only (no Pod runs; tests/test_k8s_egress_docker.py runs the real proxy path)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from cryptography import x509

from sandbox.config import load_config_text
from sandbox.config.merge import effective_agent
from sandbox.config.models import Config
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.egress_secrets import CA_BUNDLE, CA_VARIABLES
from sandbox.runtime.kubernetes import proxy_edge
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import namespace_for, policy_hash
from sandbox.runtime.kubernetes.proxy_ca import CERT_FILE, KEY_FILE, PROXY_CA_MOUNT, ca_secret, new_ca
from sandbox.runtime.kubernetes.pss import violations
from sandbox.runtime.kubernetes.tenant import Orchestrator, tenant_objects
from sandbox.runtime.spec import SandboxSpec, egress_policy, spec_from_config
from tests.k8s_fake_cluster import FakeCluster

pytestmark = pytest.mark.anyio


def _config(tmp_path: Path, secrets: bool = True) -> Config:
    secret = ', secrets: {API_TOKEN: {value_from: "env:SBX_TEST_CA_TOKEN", hosts: [api.example.com]}}'
    return load_config_text(
        f"""
state_dir: {tmp_path / "state"}
instance: ca1
runtime:
  backend: kubernetes
  kubernetes: {{seccomp: "Localhost:agent-sandbox/strict.json"}}
tenants: [{{id: acme}}]
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
        egress: {{allow: [api.example.com]{secret if secrets else ""}}}
""",
        base_dir=tmp_path,
    )


def _digest(config: Config) -> str:
    return policy_hash(egress_policy(effective_agent(config, "web")))


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeCluster]:
    monkeypatch.setenv("SBX_TEST_CA_TOKEN", "a-value")
    namespace = namespace_for(_config(tmp_path).runtime.kubernetes, "acme")
    # the Role's grants on Secrets (tenant.py): create, and get of the CA Secrets by name only
    forbidden = {("get", "secrets"), ("list", "secrets")}
    granted = {("get", "secrets", f"proxy-{_digest(_config(tmp_path, s))}-ca") for s in (True, False)}
    async with FakeCluster(namespaces={namespace}, forbidden=forbidden, granted=granted) as fake:
        for secrets in (True, False):
            digest = _digest(_config(tmp_path, secrets))
            service = {
                "metadata": {"name": f"proxy-{digest}", "namespace": namespace},
                "spec": {"clusterIP": "10.96.0.9"},
            }
            fake.objects[("services", namespace, f"proxy-{digest}")] = service
        yield fake


def _leaf_pem() -> str:
    """A server's certificate (basicConstraints CA:FALSE): valid PEM, not a CA."""
    import datetime

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "api.example.com")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _spec(config: Config, session: str) -> SandboxSpec:
    return spec_from_config(config, effective_agent(config, "web"), session, "ca1")


def _pod(cluster: FakeCluster, name: str) -> dict[str, Any]:
    return next(obj for (kind, _, n), obj in cluster.objects.items() if kind == "pods" and n == name)


def _ca_secret(cluster: FakeCluster) -> dict[str, Any]:
    (found,) = [o for (k, _, n), o in cluster.objects.items() if k == "secrets" and n.endswith("-ca")]
    return found


def _stored_cert(cluster: FakeCluster) -> str:
    return base64.b64decode(_ca_secret(cluster)["data"][CERT_FILE]).decode()


def _trusted(pod: dict[str, Any]) -> str:
    """The certificate the Pod's bundle step writes (its last argument)."""
    (step,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "egress-ca"]
    return str(step["command"][-1])


async def test_the_first_egress_pod_makes_the_ca_and_another_replica_trusts_the_same(
    tmp_path: Path, cluster: FakeCluster
) -> None:
    """Replica A finds no CA and creates it; replica B (another process) reads it by name and
    creates none; both sandboxes trust exactly the certificate in the Secret, through a bundle
    mounted read-only where every CA variable points."""
    config = _config(tmp_path)
    boxes = []
    for session in ("agent:web:a", "agent:web:b"):
        backend = KubernetesBackend(config, api=cluster.api())
        try:
            boxes.append(await backend.ensure(_spec(config, session)))
        finally:
            await backend.aclose()
    stored = _stored_cert(cluster)
    cert = x509.load_pem_x509_certificate(stored.encode())
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for box in boxes:
        pod = _pod(cluster, box.id)
        assert _trusted(pod) == stored
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert {env[name] for name in CA_VARIABLES} == {CA_BUNDLE}
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "egress-ca"]
        assert mount["readOnly"] is True and CA_BUNDLE.startswith(mount["mountPath"] + "/")
        assert "BEGIN RSA PRIVATE KEY" not in str(pod) and "PRIVATE KEY" not in str(pod)
    secret_requests = [(m, p.rsplit("/", 1)[-1]) for m, p in cluster.requests if "/secrets" in p]
    ca = f"proxy-{_digest(config)}-ca"
    # A: the CA looked for (none), created; its policy Secret created. B: the CA found and read;
    # no CA made; its policy Secret created (409: exists) and patched whole
    assert secret_requests == [
        ("GET", ca),
        ("POST", "secrets"),
        ("POST", "secrets"),
        ("GET", ca),
        ("POST", "secrets"),
        ("PATCH", ca.removesuffix("-ca")),
    ]


async def test_when_two_replicas_create_at_once_the_loser_trusts_the_winners(
    tmp_path: Path, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between this replica's look (none yet) and its create, another replica creates the CA:
    the create answers 409 and the Pod trusts the other's certificate, never its own."""
    config = _config(tmp_path)
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    digest = _digest(config)
    theirs_key, theirs = new_ca(namespace, digest)
    made_here = []

    def racing_new_ca(ns: str, d: str) -> tuple[str, str]:
        mine = new_ca(ns, d)
        made_here.append(mine[1])
        # the other replica's create lands first (what the API server would hold)
        planted = ca_secret("acme", ns, d, theirs_key, theirs)
        planted["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in planted.pop("stringData").items()}
        cluster.objects[("secrets", ns, f"proxy-{d}-ca")] = planted
        return mine

    monkeypatch.setattr(proxy_edge, "new_ca", racing_new_ca)
    backend = KubernetesBackend(config, api=cluster.api())
    try:
        box = await backend.ensure(_spec(config, "agent:web:race"))
    finally:
        await backend.aclose()
    assert made_here and made_here[0] != theirs
    assert _trusted(_pod(cluster, box.id)) == theirs == _stored_cert(cluster)


@pytest.mark.parametrize("damage", ["garbage", "a leaf certificate", "missing"])
async def test_a_ca_secret_without_a_ca_certificate_is_refused(
    tmp_path: Path, cluster: FakeCluster, damage: str
) -> None:
    """A Secret under the CA's name that holds no CA certificate (planted, damaged) makes no Pod:
    the sandbox is never made to trust whatever is there; the error names the Secret and the fix."""
    config = _config(tmp_path)
    namespace = namespace_for(config.runtime.kubernetes, "acme")
    name = f"proxy-{_digest(config)}-ca"
    if damage == "garbage":
        data = {CERT_FILE: base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnope\n").decode()}
    elif damage == "a leaf certificate":
        data = {CERT_FILE: base64.b64encode(_leaf_pem().encode()).decode()}
    else:
        data = {}
    cluster.objects[("secrets", namespace, name)] = {"metadata": {"name": name, "namespace": namespace}, "data": data}
    backend = KubernetesBackend(config, api=cluster.api())
    try:
        with pytest.raises(SandboxUnavailable, match=name) as caught:
            await backend.ensure(_spec(config, "agent:web:bad"))
    finally:
        await backend.aclose()
    assert [k for k in cluster.objects if k[0] == "pods"] == []
    assert "delete it" in caught.value.message or "not a CA" in caught.value.message


async def test_a_policy_without_secrets_has_no_ca(tmp_path: Path, cluster: FakeCluster) -> None:
    """The proxy decrypts nothing: no CA Secret, no bundle step, no CA variables."""
    config = _config(tmp_path, secrets=False)
    backend = KubernetesBackend(config, api=cluster.api())
    try:
        box = await backend.ensure(_spec(config, "agent:web:plain"))
    finally:
        await backend.aclose()
    pod = _pod(cluster, box.id)
    assert "initContainers" not in pod["spec"]
    env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert not env & set(CA_VARIABLES)
    assert [k for k in cluster.objects if k[0] == "secrets" and k[2].endswith("-ca")] == []


@pytest.mark.parametrize("version", ["1.33", "1.37"])
def test_the_proxy_loads_its_ca_from_the_secret_and_stays_restricted(tmp_path: Path, version: str) -> None:
    """The proxy Deployment of a policy with secrets mounts its CA Secret read-only (0440, its
    group) and copies it into mitmproxy's confdir before starting; strict schema and restricted."""
    config = _config(tmp_path)
    digest = _digest(config)
    objects = tenant_objects(config, config.tenants[0], Orchestrator())
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    kubernetes_validate.validate(deployment, version, strict=True)
    template = deployment["spec"]["template"]
    assert violations({"kind": "Pod", **template}, "restricted", f"v{version}") == []
    (volume,) = [v for v in template["spec"]["volumes"] if "secret" in v]
    assert volume["secret"] == {"secretName": f"proxy-{digest}-ca", "defaultMode": 0o440}
    proxy = template["spec"]["containers"][0]
    assert {"name": "ca", "mountPath": PROXY_CA_MOUNT, "readOnly": True} in proxy["volumeMounts"]
    script = proxy["command"][4]
    assert f"{PROXY_CA_MOUNT}/{KEY_FILE}" in script and script.rstrip().endswith('exec "$@"')
    assert proxy["command"][6] == "mitmdump"
    assert proxy["imagePullPolicy"] == config.runtime.kubernetes.image_pull_policy  # a `kind load`ed image starts
    plain = tenant_objects(_config(tmp_path, secrets=False), config.tenants[0], Orchestrator())
    plain_proxy = next(o for o in plain if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert [v["name"] for v in plain_proxy["volumes"]] == ["tmp"]  # nothing to decrypt: no CA


@pytest.mark.parametrize("version", ["1.33", "1.37"])
@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_the_sandbox_pod_with_its_bundle_step_passes_the_schemas_and_restricted(
    tmp_path: Path, cluster: FakeCluster, version: str
) -> None:
    config = _config(tmp_path)
    backend = KubernetesBackend(config, api=cluster.api())
    try:
        box = await backend.ensure(_spec(config, "agent:web:schema"))
    finally:
        await backend.aclose()
    pod = _pod(cluster, box.id)
    clean = {k: v for k, v in pod.items() if k != "status"}
    clean["metadata"] = {
        k: v for k, v in pod["metadata"].items() if k in ("name", "namespace", "labels", "annotations")
    }
    kubernetes_validate.validate(clean, version, strict=True)
    assert violations(clean, "restricted", f"v{version}") == []
    step = pod["spec"]["initContainers"][0]
    assert step["securityContext"] == pod["spec"]["containers"][0]["securityContext"]
    assert step["image"] == pod["spec"]["containers"][0]["image"]
