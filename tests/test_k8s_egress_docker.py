"""The egress path on a cluster, with real parts: the fake API's Pods are real containers on a
network of the test's own (its "CNI"), and the proxy is the real egress image started exactly as
the rendered Deployment says (its command, its user, its environment from the policy Secret the
backend wrote, its CA Secret's files mounted read-only). A sandbox of that proxy sends a secret's
placeholder to the lab's HTTPS server: the server receives the value, because the proxy
decrypted the tunnel with the CA that the backend made, the proxy loaded, and the sandbox's
bundle step wrote into its read-only bundle. Without that bundle the same request is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from click.testing import CliRunner

from sandbox.cli import main as cli_main
from sandbox.config import load_config
from sandbox.config.merge import effective_agent
from sandbox.engine.orchestrator import Orchestrator
from sandbox.runtime.kubernetes import egress_log
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import namespace_for, policy_hash
from sandbox.runtime.kubernetes.proxy_ca import CERT_FILE, KEY_FILE
from sandbox.runtime.spec import egress_policy
from tests.conftest import RUN_ID, TEST_LABEL
from tests.egress_lab import Lab
from tests.k8s_egress_lab import secret_files, start_proxy
from tests.k8s_fake_cluster import FakeCluster

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]
VALUE = "k8s-s3cret-value-0123456789"
CURL = 'curl -sS -m 20 -H "Authorization: Bearer $API_TOKEN" https://allowed.test:8443/headers'


def _config(tmp_path: Path, lab: Lab, kubeconfig: Path) -> Path:
    """The config as a file (the CLI reads it too), its cluster the fake's kubeconfig."""
    upstream_ca = tmp_path / "upstream-ca.pem"
    upstream_ca.write_text(lab.web_cert)
    sandbox = (
        "{mode: all, scope: session, workspace_access: none, docker: {network: egress}, "
        f"egress: {{allow: [allowed.test], ports: [8443], allow_private: ['{lab.web_ip}/32'], "
        f"upstream_ca: '{upstream_ca}', "
        "secrets: {API_TOKEN: {value_from: 'env:SBX_TEST_K8S_SECRET', hosts: [allowed.test]}}}}"
    )
    (tmp_path / "ws").mkdir(exist_ok=True)
    path = tmp_path / "sandbox.yaml"
    path.write_text(
        f"""
state_dir: {tmp_path / "state"}
instance: {RUN_ID}e
runtime:
  backend: kubernetes
  kubernetes: {{pod_ready_timeout_s: 60, kubeconfig: {kubeconfig}, seccomp: "Localhost:agent-sandbox/strict.json"}}
tenants: [{{id: acme}}]
agents:
  list:
    - {{id: main, tenant: acme, default: true, workspace: {tmp_path / "ws"}, sandbox: {sandbox}}}
"""
    )
    return path


async def test_a_pods_secret_reaches_its_host_through_the_rendered_proxy_with_the_shared_ca(
    tmp_path: Path,
    lab: Lab,
    docker_client: Any,
    pod_network: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SBX_TEST_K8S_SECRET", VALUE)
    # a first read cut at 1 KiB (a few lines) is read again, larger: every line reaches the journal
    monkeypatch.setattr(egress_log, "LOG_LIMIT_BYTES", 1024)
    monkeypatch.setattr(egress_log, "GROWTH", 1024)
    network, proxy_ip = pod_network
    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, RUN_ID), pod_network=network) as cluster:
        config_file = _config(tmp_path, lab, cluster.kubeconfig(tmp_path / "kubeconfig"))
        config = load_config(config_file)
        namespace = namespace_for(config.runtime.kubernetes, "acme")
        digest = policy_hash(egress_policy(effective_agent(config, "main")))
        cluster.namespaces.add(namespace)
        service = {"metadata": {"name": f"proxy-{digest}", "namespace": namespace}, "spec": {"clusterIP": proxy_ip}}
        cluster.objects[("services", namespace, f"proxy-{digest}")] = service
        async with Orchestrator(config, KubernetesBackend(config, api=cluster.api())) as orch:
            session = orch.session(agent="main", key="agent:main:egress1")
            # the first call makes the Pod: the backend writes the CA and the policy Secrets
            placeholder = await session.call("exec", {"command": "printenv API_TOKEN"})
            assert placeholder.ok, placeholder.error
            assert placeholder.output["output"].strip() not in ("", VALUE)
            _, ready = start_proxy(docker_client, cluster, config, lab, network, proxy_ip, tmp_path, digest)
            stored = secret_files(cluster, namespace, f"proxy-{digest}-ca")
            # the proxy serves with the CA the backend made (its ready line carries the certificate)
            assert ready["ready"] is True and ready["ca"].strip() == stored[CERT_FILE].decode().strip()
            assert stored[KEY_FILE].startswith(b"-----BEGIN RSA PRIVATE KEY-----")

            sent = await session.call(
                "exec",
                {
                    "command": 'curl -sS -m 20 -H "Authorization: Bearer $API_TOKEN" https://allowed.test:8443/headers',
                    "timeout_s": 30,
                },
            )
            assert sent.ok and sent.output["exit_code"] == 0, (sent.error, sent.output)
            assert sent.output["output"].strip() == "ok"
            assert lab.web_heard()[-1] == f"AUTH Bearer {VALUE} X-KEY None"

            # the trust is the bundle's: with the image's CAs alone the proxy's certificate is refused
            untrusted = await session.call(
                "exec",
                {
                    "command": "curl -sS -m 20 --cacert /etc/ssl/certs/ca-certificates.crt https://allowed.test:8443/headers",
                    "timeout_s": 30,
                },
            )
            assert untrusted.output["exit_code"] == 60, untrusted.output  # curl: peer certificate cannot be verified
            # and the sandbox cannot change what it trusts
            tamper = await session.call("exec", {"command": 'echo x >> "$SSL_CERT_FILE"; ls -ld /tmp/.egress'})
            assert "Read-only file system" in tamper.output["output"], tamper.output
            heard = len(lab.web_heard())
            await session.close()  # collects its last lines before its Pod goes
            mine = [e.data for e in orch.journal.events(session=session.key) if e.stage == "egress"]

        # a second session's sandbox on the same proxy, run by an orchestrator without a journal
        # (nothing collects at its calls): `sandbox logs` collects its lines from the proxy's log
        other_backend = KubernetesBackend(config, api=cluster.api())
        async with Orchestrator(config, other_backend, journal=False) as orch2:
            other = orch2.session(agent="main", key="agent:main:egress2")
            for _ in range(2):
                again = await other.call("exec", {"command": CURL, "timeout_s": 30})
                assert again.ok and again.output["output"].strip() == "ok", again.output
            heard += 2
            shown = await anyio.to_thread.run_sync(
                lambda: CliRunner().invoke(
                    cli_main, ["--config", str(config_file), "logs", "--session", other.key, "--json"]
                )
            )
            assert shown.exit_code == 0, shown.output
            await other.close()
        async with Orchestrator(config, KubernetesBackend(config, api=cluster.api())) as reader:
            theirs = [e.data for e in reader.journal.events(session=other.key) if e.stage == "egress"]
            assert mine == [e.data for e in reader.journal.events(session=session.key) if e.stage == "egress"]
    assert len(lab.web_heard()) == heard  # nothing more reached the server
    # the proxy's lines, each in the journal of the session whose Pod sent it, once
    gets = [line for line in mine if line["method"] == "GET"]
    assert [(g["host"], g["injected"], g["verdict"]) for g in gets] == [("allowed.test", "API_TOKEN", "allowed")]
    assert len([line for line in theirs if line["method"] == "GET"]) == 2
    # the network hands a freed address out again: the second Pod usually has the first one's, and
    # its lines are still only its own (the first Pod's were journaled before it went)
    assert {line["client"] for line in mine} and {line["client"] for line in theirs}
    assert all(line["tenant"] == "acme" for line in mine + theirs)
