"""What the Kubernetes backend renders: valid for the API server (strict schemas of 1.33 and
1.37), restricted by construction, fenced per tenant, and refusing what a restricted Pod cannot do."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sandbox.config import load_config_text
from sandbox.config.kubernetes import KubernetesSection
from sandbox.errors import ConfigError
from sandbox.runtime.kubernetes.names import K8sLabels, label_value, namespace_for
from sandbox.runtime.kubernetes.pod import PROTECT_SCRIPT, sandbox_pod
from sandbox.runtime.kubernetes.pss import violations
from sandbox.runtime.kubernetes.tenant import Orchestrator, tenant_objects
from tests.cli_helpers import run_cli
from tests.k8s_helpers import every_object, k8s_config, pod_objects, spec_of

VERSIONS = ("1.33", "1.37")


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_passes_the_api_schemas_strictly(tmp_path: Path, version: str) -> None:
    objects = every_object(k8s_config(tmp_path, "    runtime_class_name: gvisor\n    image_pull_secrets: [regcred]"))
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ResourceQuota", "LimitRange"} <= kinds
    assert {"NetworkPolicy", "Deployment", "Service", "PersistentVolumeClaim", "Pod"} <= kinds
    for obj in objects:
        # raises ValidationError on an unknown field (strict) or a wrong type
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.slow
def test_a_misspelt_field_fails_the_strict_schema() -> None:
    """The schema check is real: it rejects a field the API does not know."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [], "hostNetwrk": True}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, "1.37", strict=True)


@pytest.mark.parametrize("version", ["v1.25", "v1.33", "v1.37"])
def test_every_pod_and_template_passes_restricted(tmp_path: Path, version: str) -> None:
    objects = every_object(k8s_config(tmp_path, f"    pss_version: {version}"))
    workloads = [o for o in objects if o["kind"] in ("Pod", "Deployment")]
    assert len(workloads) == 6  # five sandboxes and acme's one proxy
    for obj in workloads:
        assert violations(obj, "restricted", version) == [], obj["metadata"]["name"]


def test_the_namespace_enforces_restricted_at_the_pinned_version(tmp_path: Path) -> None:
    config = k8s_config(tmp_path, "    pss_version: v1.31")
    namespace = tenant_objects(config, config.tenants[0], Orchestrator())[0]
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
        assert labels[f"pod-security.kubernetes.io/{mode}-version"] == "v1.31"


def test_a_sandbox_pod_has_no_token_no_resolver_and_requests_equal_limits(tmp_path: Path) -> None:
    pod = pod_objects(k8s_config(tmp_path), "coder")[-1]
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["dnsPolicy"] == "None" and spec["dnsConfig"]["nameservers"] == ["127.0.0.1"]
    assert spec["restartPolicy"] == "Never"
    for container in spec["containers"] + spec.get("initContainers", []):
        resources = container["resources"]
        assert resources["requests"] == resources["limits"]
        assert set(resources["limits"]) == {"cpu", "memory", "ephemeral-storage"}
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert not any("hostPath" in v for v in spec["volumes"])
    claim = next(v for v in spec["volumes"] if v["name"] == "workspace")["persistentVolumeClaim"]
    assert claim == {"claimName": pod_objects(k8s_config(tmp_path), "coder")[0]["metadata"]["name"], "readOnly": False}


def test_workspaces_map_to_claims_and_scratch(tmp_path: Path) -> None:
    config = k8s_config(tmp_path)
    scratch = pod_objects(config, "scratch")
    assert [o["kind"] for o in scratch] == ["Pod"]  # workspace none: an emptyDir of scratch_size
    volume = next(v for v in scratch[0]["spec"]["volumes"] if v["name"] == "workspace")
    assert volume == {"name": "workspace", "emptyDir": {"sizeLimit": "1Gi"}}
    reader = pod_objects(config, "reader")
    mount = next(m for m in reader[1]["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/workspace")
    assert mount["readOnly"] is True
    team_claim = pod_objects(config, "team")[0]
    assert team_claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert team_claim["spec"]["storageClassName"] == "nfs-rwx"
    coder_claim = pod_objects(config, "coder")[0]
    assert coder_claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert coder_claim["spec"]["storageClassName"] == "standard"


def test_egress_sandboxes_reach_only_their_own_proxy(tmp_path: Path) -> None:
    config = k8s_config(tmp_path)
    pod = pod_objects(config, "web", proxy_ip="10.96.7.7")[-1]
    digest = pod["metadata"]["labels"][K8sLabels.EGRESS]
    assert pod["spec"]["hostAliases"] == [{"ip": "10.96.7.7", "hostnames": ["egress-proxy"]}]
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == "http://egress-proxy:3128"
    objects = tenant_objects(config, config.tenants[0], Orchestrator())
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    # deny-all selects every sandbox, the egress one included
    # deny-all selects every Pod of the namespace, labelled or not
    assert policies["sbx-deny-all"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    to_proxy = policies[f"sbx-to-proxy-{digest}"]
    selector = to_proxy["podSelector"]["matchLabels"]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items())
    assert to_proxy["egress"] == [
        {
            "to": [{"podSelector": {"matchLabels": {K8sLabels.KIND: "egress-proxy", K8sLabels.EGRESS: digest}}}],
            "ports": [{"protocol": "TCP", "port": 3128}],
        }
    ]
    # the proxy's way out leaves out every private and link-local (metadata) range
    out = policies[f"proxy-{digest}"]["egress"][0]
    v4 = next(b["ipBlock"] for b in out["to"] if b["ipBlock"]["cidr"] == "0.0.0.0/0")
    excluded = [ipaddress.ip_network(c) for c in v4["except"]]
    for address in ("169.254.169.254", "10.0.0.1", "172.16.0.1", "192.168.1.1", "100.100.100.200", "127.0.0.1"):
        assert any(ipaddress.ip_address(address) in net for net in excluded), address
    assert out["ports"] == [{"protocol": "TCP", "port": 443}]
    # a tenant without egress agents has no proxy
    beta = tenant_objects(config, config.tenants[1], Orchestrator())
    assert not [o for o in beta if o["kind"] == "Deployment"]


def test_the_proxy_gets_its_policy_from_a_secret_and_is_not_a_sidecar(tmp_path: Path) -> None:
    config = k8s_config(tmp_path)
    deployment = next(o for o in tenant_objects(config, config.tenants[0], Orchestrator()) if o["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    assert K8sLabels.SANDBOX not in template["metadata"]["labels"]
    env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
    assert env["EGRESS_POLICY"]["valueFrom"]["secretKeyRef"]["name"] == deployment["metadata"]["name"]
    sandbox = pod_objects(config, "web")[-1]
    assert [c["name"] for c in sandbox["spec"]["containers"]] == ["sandbox"]  # no proxy beside it


def test_the_role_is_namespaced_and_grants_exec(tmp_path: Path) -> None:
    config = k8s_config(tmp_path)
    objects = tenant_objects(config, config.tenants[0], Orchestrator("ops", "sbx-orch"))
    kinds = [o["kind"] for o in objects]
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    role = next(o for o in objects if o["kind"] == "Role")
    exec_rule = next(r for r in role["rules"] if r["resources"] == ["pods/exec"])
    assert sorted(exec_rule["verbs"]) == ["create", "get"]
    granted = {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    # nothing the backend does not do: no reading secrets, no deleting workspaces, and patch only
    # on Pods (the warm pool's claim) and the proxies' Secrets (test_k8s_proxy_secret.py)
    assert "configmaps" not in {r for r, _ in granted}
    assert {verb for r, verb in granted if r == "secrets"} == {"create", "patch"}
    assert ("persistentvolumeclaims", "delete") not in granted
    assert {r for r, verb in granted if verb in ("patch", "update")} == {"pods", "secrets"}
    assert {verb for r, verb in granted if r == "pods"} == {"get", "list", "watch", "create", "patch", "delete"}
    binding = next(o for o in objects if o["kind"] == "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sbx-orch", "namespace": "ops"}]
    account = next(o for o in objects if o["kind"] == "ServiceAccount")
    assert account["automountServiceAccountToken"] is False


def test_quotas_follow_the_tenant(tmp_path: Path) -> None:
    config = k8s_config(tmp_path)
    objects = tenant_objects(config, config.tenants[0], Orchestrator())
    hard = next(o for o in objects if o["kind"] == "ResourceQuota")["spec"]["hard"]
    assert hard["pods"] == "9"  # 8 sandboxes and the one proxy
    assert hard["requests.storage"] == f"{50 * 1024}Mi"
    # the largest agent (web: 2 cpus, 2g) times 8, plus the proxy's one cpu and 512 MiB
    assert hard["limits.cpu"] == f"{2000 * 8 + 1000}m"
    assert hard["limits.memory"] == f"{2048 * 8 + 512}Mi"
    beta = tenant_objects(config, config.tenants[1], Orchestrator())
    assert "pods" not in next(o for o in beta if o["kind"] == "ResourceQuota")["spec"]["hard"]


@pytest.mark.parametrize(
    ("docker", "key"),
    [
        ("{binds: ['BINDDIR:/data:ro']}", "docker.binds"),
        ("{cap_add: [SYS_ADMIN]}", "sandbox.docker.cap_add"),
        ("{network: bridge}", "sandbox.docker.network"),
        ("{user: '0:0'}", "sandbox.docker.user"),
        ("{no_new_privileges: false}", "sandbox.docker.no_new_privileges"),
        ("{user: nobody}", "sandbox.docker.user"),
        ("{user: '1000:0'}", "sandbox.docker.user"),
        ("{runtime: runsc}", "sandbox.docker.runtime"),
        ("{ulimits: {nofile: {soft: 10, hard: 10}}}", "sandbox.docker.ulimits"),
        ("{setup_command: 'true', setup_as_root: true}", "sandbox.docker.setup_as_root"),
    ],
)
@pytest.mark.slow
def test_what_restricted_cannot_do_is_refused_naming_the_key(tmp_path: Path, docker: str, key: str) -> None:
    (tmp_path / "ws-odd").mkdir()
    (tmp_path / "data").mkdir()
    full = k8s_config(tmp_path).model_dump(mode="json")
    docker_cfg = yaml.safe_load(docker.replace("BINDDIR", str(tmp_path / "data")))
    full["agents"]["list"].append(
        {"id": "odd", "tenant": "acme", "workspace": str(tmp_path / "ws-odd"), "sandbox": {"docker": docker_cfg}}
    )
    config = load_config_text(yaml.safe_dump(full), base_dir=tmp_path)
    with pytest.raises(ConfigError) as caught:
        sandbox_pod(spec_of(config, "odd"), config.runtime.kubernetes, "ns")
    assert any(key in problem for problem in caught.value.problems), caught.value.problems


def _scratch(full: dict[str, Any]) -> dict[str, Any]:
    """The docker settings of agent `scratch` in a dumped config."""
    agent = next(a for a in full["agents"]["list"] if a["id"] == "scratch")
    docker: dict[str, Any] = agent["sandbox"]["docker"]
    return docker


@pytest.mark.slow
def test_the_strict_seccomp_profile_is_never_weakened_silently(tmp_path: Path) -> None:
    full = k8s_config(tmp_path).model_dump(mode="json")
    full["runtime"]["kubernetes"]["seccomp"] = "RuntimeDefault"
    config = load_config_text(yaml.safe_dump(full), base_dir=tmp_path)
    with pytest.raises(ConfigError, match="seccomp_profile: strict") as caught:
        sandbox_pod(spec_of(config, "scratch"), config.runtime.kubernetes, "ns")
    assert "sandbox k8s seccomp" in caught.value.problems[0]
    _scratch(full)["seccomp_profile"] = "default"  # asked for the weaker one
    config = load_config_text(yaml.safe_dump(full), base_dir=tmp_path)
    pod = sandbox_pod(spec_of(config, "scratch"), config.runtime.kubernetes, "ns")
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    printed = run_cli("k8s", "seccomp")
    assert printed.returncode == 0 and '"defaultAction"' in printed.stdout


@pytest.mark.slow
def test_the_image_entrypoint_stays_pid_1_and_apparmor_is_kept(tmp_path: Path) -> None:
    pod = pod_objects(k8s_config(tmp_path), "scratch")[-1]
    container = pod["spec"]["containers"][0]
    assert "command" not in container and container["args"] == ["sleep", "infinity"]
    full = k8s_config(tmp_path).model_dump(mode="json")
    _scratch(full)["apparmor_profile"] = "sandbox-profile"
    config = load_config_text(yaml.safe_dump(full), base_dir=tmp_path)
    armored = sandbox_pod(spec_of(config, "scratch"), config.runtime.kubernetes, "ns")
    assert armored["spec"]["containers"][0]["securityContext"]["appArmorProfile"] == {
        "type": "Localhost",
        "localhostProfile": "sandbox-profile",
    }
    kubernetes_validate.validate(armored, "1.33", strict=True)
    assert violations(armored) == []


def test_an_egress_pod_without_its_proxy_address_is_refused(tmp_path: Path) -> None:
    config = k8s_config(tmp_path)
    with pytest.raises(ConfigError, match="egress proxy"):
        sandbox_pod(spec_of(config, "web"), config.runtime.kubernetes, "ns")


TENANT_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", fullmatch=True)


@given(TENANT_IDS, TENANT_IDS)
def test_tenant_namespaces_are_dns_labels_and_never_shared(a: str, b: str) -> None:
    cfg = KubernetesSection()
    for tenant in (a, b):
        name = namespace_for(cfg, tenant)
        assert len(name) <= 63
        assert name.startswith("sbx-")
        assert all(c.islower() or c.isdigit() or c == "-" for c in name) and not name.endswith("-")
    if a != b:
        assert namespace_for(cfg, a) != namespace_for(cfg, b)


@given(st.text(min_size=1, max_size=200))
def test_label_values_are_always_valid(text: str) -> None:
    value = label_value(text)
    assert len(value) <= 63
    assert re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?", value)


def test_a_fixed_namespace_serves_one_tenant_only(tmp_path: Path) -> None:
    cfg = KubernetesSection(namespace="sandboxes")
    assert namespace_for(cfg, "acme") == "sandboxes"
    config = k8s_config(tmp_path, "    namespace: sandboxes")  # two tenants: one quota and one policy set
    with pytest.raises(ConfigError, match=r"one namespace \(sandboxes\) for 2 tenants"):
        tenant_objects(config, config.tenants[0], Orchestrator())


def test_a_tenant_named_like_anothers_hash_gets_its_own_namespace() -> None:
    cfg = KubernetesSection()
    hashed = namespace_for(cfg, "Acme")
    assert namespace_for(cfg, hashed.removeprefix("sbx-")) != hashed
    assert namespace_for(cfg, "acme") != namespace_for(cfg, "Acme")


def _protect(root: Path, *items: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROTECT_SCRIPT, str(root), *items],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )


def test_the_protect_step_makes_files_as_files_and_folders_as_folders(tmp_path: Path) -> None:
    done = _protect(tmp_path, "dir:.git", "file:.git/config", "dir:.git/hooks")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".git/config").is_file() and (tmp_path / ".git/hooks").is_dir()
    assert _protect(tmp_path, "file:.git/config").returncode == 0  # idempotent on a second start


def test_the_protect_step_refuses_a_planted_link(tmp_path: Path) -> None:
    """A sandbox plants `.git -> /somewhere`: the init step fails the Pod instead of creating or
    letting the kubelet mount anything through the link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.symlink(outside, workspace / ".git")
    done = _protect(workspace, "dir:.git", "file:.git/config")
    assert done.returncode != 0
    assert "symbolic link" in done.stderr
    assert list(outside.iterdir()) == []


def test_the_protect_step_refuses_a_file_where_a_folder_goes_without_crashing(tmp_path: Path) -> None:
    (tmp_path / ".git").write_text("gitdir: elsewhere\n")  # a linked worktree's .git is a file
    done = _protect(tmp_path, "dir:.git", "file:.git/config")
    assert done.returncode != 0 and "is not a folder" in done.stderr and "Traceback" not in done.stderr


def test_the_protect_step_refuses_a_hard_link(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "elsewhere").write_text("[core]\n")
    os.link(tmp_path / "elsewhere", tmp_path / ".git" / "config")  # .git/config writable as `elsewhere`
    done = _protect(tmp_path, "dir:.git", "file:.git/config")
    assert done.returncode != 0 and "hard link" in done.stderr


def test_the_protect_step_imports_nothing_from_the_workspace(tmp_path: Path) -> None:
    pod = pod_objects(k8s_config(tmp_path), "coder")[-1]
    step = pod["spec"]["initContainers"][0]
    assert step["command"][:4] == ["python3", "-I", "-S", "-c"] and step["workingDir"] == "/"


@pytest.mark.slow
def test_cli_render_and_pod_print_valid_yaml(tmp_path: Path) -> None:
    config = k8s_config(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    rendered = run_cli("k8s", "render", "--tenant", "acme", "--orchestrator", "ops/orch", config=path)
    assert rendered.returncode == 0, rendered.stderr
    objects = list(yaml.safe_load_all(rendered.stdout))
    assert objects[0]["kind"] == "Namespace" and objects[0]["metadata"]["name"].startswith("sbx-acme-")
    for obj in objects:
        kubernetes_validate.validate(obj, "1.37", strict=True)
    pod = run_cli("k8s", "pod", "--agent", "coder", "--session", "agent:coder:main", config=path)
    assert pod.returncode == 0, pod.stderr
    kinds = [o["kind"] for o in yaml.safe_load_all(pod.stdout)]
    assert kinds == ["PersistentVolumeClaim", "Pod"]
    unknown = run_cli("k8s", "render", "--tenant", "nobody", config=path)
    assert unknown.returncode == 2 and "nobody" in unknown.stderr
    refused = run_cli("k8s", "pod", "--agent", "web", "--session", "agent:web:s", config=path)
    assert refused.returncode == 2 and "egress proxy" in refused.stderr


def test_explain_shows_the_pod_and_the_exec_path(tmp_path: Path) -> None:
    config = k8s_config(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    done = run_cli("explain", "--agent", "coder", "--session", "agent:coder:x", config=path)
    assert done.returncode == 0, done.stderr
    assert "pod        sbx-acme-" in done.stdout and "Pod Security restricted" in done.stdout
    assert "workspace  claim ws-coder-" in done.stdout
    assert "v5.channel.k8s.io offered first" in done.stdout and "v4.channel.k8s.io" in done.stdout
    assert "container " not in done.stdout  # no Docker container is described on a cluster


@pytest.mark.slow
def test_the_setup_command_is_the_last_init_step_with_the_sandboxs_view(tmp_path: Path) -> None:
    """`setup_command` runs before the sandbox serves anything, as its user, on its volumes (what
    it writes to the workspace and to the tmpfs emptyDirs is there when the sandbox starts)."""
    full = k8s_config(tmp_path).model_dump(mode="json")
    coder = next(a for a in full["agents"]["list"] if a["id"] == "coder")
    coder["sandbox"]["docker"] = {"setup_command": "pip install --target /tmp/deps rich && git init -q"}
    config = load_config_text(yaml.safe_dump(full), base_dir=tmp_path)
    pod = sandbox_pod(spec_of(config, "coder"), config.runtime.kubernetes, "ns")
    setup = pod["spec"]["initContainers"][-1]
    container = pod["spec"]["containers"][0]
    assert setup["name"] == "setup" and setup["command"][-1].startswith("pip install")
    assert setup["volumeMounts"] == container["volumeMounts"] and setup["env"] == container["env"]
    assert setup["securityContext"] == container["securityContext"]
    assert setup["terminationMessagePolicy"] == "FallbackToLogsOnError"  # its output is the reason it failed
    assert violations(pod, "restricted", "v1.33") == []
    for version in VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
