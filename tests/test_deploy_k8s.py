"""deploy/k8s/: the service's own manifests are valid for the API server, restricted, and in step
with compose.yaml (the same command, port, grace and state path as on one host)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sandbox.config import load_config, load_config_text
from sandbox.runtime.kubernetes.pss import violations

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy/k8s"


def manifests() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for name in yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]:
        found += [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]
    return found


def by_kind(kind: str) -> dict[str, Any]:
    return next(m for m in manifests() if m["kind"] == kind)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["1.33", "1.37"])
def test_every_manifest_passes_the_api_schemas_strictly(version: str) -> None:
    kinds = [m["kind"] for m in manifests()]
    assert kinds == [
        "Namespace",
        "ServiceAccount",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]
    for manifest in manifests():
        kubernetes_validate.validate(manifest, version, strict=True)


def test_the_service_pod_passes_restricted_and_has_no_host_access() -> None:
    deployment = by_kind("Deployment")
    assert violations(deployment, "restricted", "v1.33") == []
    pod = deployment["spec"]["template"]["spec"]
    assert not any(pod.get(f) for f in ("hostNetwork", "hostPID", "hostIPC"))
    assert not any("hostPath" in v for v in pod["volumes"])  # no engine socket on a cluster


def test_in_step_with_compose() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["service"]
    container = by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    # the same command but the listening address (compose: loopback of the host's namespace)
    assert [a for a in args if a != "0.0.0.0"] == [
        a.replace("${SANDBOX_PORT:-8710}", "8710") for a in compose["command"] if a != "127.0.0.1"
    ]
    assert container["image"] == compose["image"]
    grace = int(compose["stop_grace_period"].rstrip("s"))
    assert by_kind("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace
    state = next(m for m in container["volumeMounts"] if m["name"] == "state")
    assert any(v.endswith(":" + state["mountPath"]) for v in compose["volumes"])
    config = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert args[args.index("--config") + 1].startswith(config["mountPath"] + "/")
    probes = {container["livenessProbe"]["httpGet"]["path"], container["readinessProbe"]["httpGet"]["path"]}
    assert probes == {"/healthz", "/readyz"}
    assert by_kind("Service")["spec"]["ports"][0]["port"] == int(args[args.index("--port") + 1])


@pytest.mark.slow
def test_the_probes_are_routes_of_the_service(tmp_path: Path) -> None:
    from sandbox.api.app import create_app

    app = create_app(load_config_text(f"state_dir: {tmp_path / 'state'}\n"))
    assert {"/healthz", "/readyz"} <= {getattr(route, "path", None) for route in app.routes}


def test_the_example_config_loads(tmp_path: Path) -> None:
    config = load_config(DEPLOY / "config.example.yaml")
    assert config.runtime.backend == "kubernetes"
    assert config.runtime.kubernetes.in_cluster is True


def test_the_e2e_script_skips_cleanly_without_a_cluster() -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    done = subprocess.run([str(ROOT / "scripts/k8s-e2e")], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0
    assert done.stdout.count("\n") == 1 and "skipped" in done.stdout


def test_the_state_url_comes_from_a_secret_when_there_is_one() -> None:
    """state.url (and its password) from the Secret agent-sandbox-state, optional: SQLite without it."""
    container = by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    ref = env["SANDBOX_STATE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "agent-sandbox-state", "key": "url", "optional": True}
