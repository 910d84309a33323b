"""`provider: agent-sandbox`: the objects rendered for kubernetes-sigs/agent-sandbox satisfy its
CRDs (v1beta1, vendored in tests/data/agent-sandbox-crds/ with the commit they came from), checked
as an API server with `fieldValidation=Strict` would (an unknown field is an error), and the Pod
inside the template is the same restricted Pod."""

from __future__ import annotations

import copy
import functools
import gzip
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from sandbox.runtime.kubernetes.agent_sandbox import provider_objects
from sandbox.runtime.kubernetes.pod import ProxyRef
from sandbox.runtime.kubernetes.pss import violations
from sandbox.runtime.kubernetes.tenant import Orchestrator, tenant_objects
from tests.cli_helpers import run_cli
from tests.k8s_helpers import k8s_config, spec_of

CRDS = Path(__file__).resolve().parent / "data/agent-sandbox-crds"


def _strict(schema: Any) -> Any:
    """The CRD's schema as the API server applies it with strict field validation: objects with
    known properties take no others (unless they preserve unknown fields); `nullable` is a type."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    known = out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
    if known and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache  # loaded by the first test that needs it, not at collection in every worker
def _schemas() -> dict[tuple[str, str], Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the templates' CRD is large
    found = {}
    for path in sorted(CRDS.glob("*.yaml.gz")):
        crd = yaml.load(gzip.decompress(path.read_bytes()), Loader=loader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            found[(f"{group}/{version['name']}", kind)] = _strict(version["schema"]["openAPIV3Schema"])
    return found


def problems(obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(_schemas()[(obj["apiVersion"], obj["kind"])])
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(obj)]


@pytest.mark.parametrize("agent", ["scratch", "reader", "coder", "web"])
@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_every_rendered_object_satisfies_the_crds(tmp_path: Path, agent: str) -> None:
    config = k8s_config(tmp_path, "    provider: agent-sandbox")
    objects = provider_objects(
        spec_of(config, agent), config.runtime.kubernetes, "sbx-acme", replicas=2, proxy=ProxyRef("10.96.0.9")
    )
    assert [o["kind"] for o in objects] == ["SandboxTemplate", "SandboxWarmPool", "SandboxClaim"]
    for obj in objects:
        assert problems(obj) == [], obj["kind"]
    template = objects[0]
    assert template["spec"]["networkPolicyManagement"] == "Unmanaged"  # our deny-all, not the provider's default
    pod = {
        "kind": "Pod",
        "metadata": template["spec"]["podTemplate"]["metadata"],
        "spec": template["spec"]["podTemplate"]["spec"],
    }
    assert violations(pod, "restricted", "v1.33") == []
    assert objects[2]["spec"]["warmPoolRef"]["name"] == objects[1]["metadata"]["name"]


def test_the_check_is_real_it_refuses_what_the_crds_refuse(tmp_path: Path) -> None:
    config = k8s_config(tmp_path, "    provider: agent-sandbox")
    template, pool, claim = provider_objects(spec_of(config, "scratch"), config.runtime.kubernetes, "ns")
    bad_claim = copy.deepcopy(claim)
    bad_claim["spec"]["lifecycle"]["shutdownPolicy"] = "Nuke"
    bad_claim["spec"]["warmpool"] = "v1alpha1-field"
    assert len(problems(bad_claim)) == 2
    bad_pool = copy.deepcopy(pool)
    bad_pool["spec"]["replicas"] = -1
    assert problems(bad_pool)
    bad_template = copy.deepcopy(template)
    bad_template["spec"]["podTemplate"]["spec"]["enableServicelinks"] = False  # a typo inside the PodSpec
    assert problems(bad_template)


def test_the_role_covers_the_provider_objects(tmp_path: Path) -> None:
    config = k8s_config(tmp_path, "    provider: agent-sandbox")
    role = next(o for o in tenant_objects(config, config.tenants[0], Orchestrator()) if o["kind"] == "Role")
    groups = {g for rule in role["rules"] for g in rule["apiGroups"]}
    assert {"extensions.agents.x-k8s.io", "agents.x-k8s.io"} <= groups
    (tmp_path / "plain").mkdir()
    plain = k8s_config(tmp_path / "plain")
    role = next(o for o in tenant_objects(plain, plain.tenants[0], Orchestrator()) if o["kind"] == "Role")
    assert {g for rule in role["rules"] for g in rule["apiGroups"]} == {""}


def test_cli_pod_prints_the_provider_objects(tmp_path: Path) -> None:
    config = k8s_config(tmp_path, "    provider: agent-sandbox")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    done = run_cli("k8s", "pod", "--agent", "scratch", "--session", "agent:scratch:s", config=path)
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    assert [o["kind"] for o in objects] == ["SandboxTemplate", "SandboxWarmPool", "SandboxClaim"]
    assert all(problems(o) == [] for o in objects)
