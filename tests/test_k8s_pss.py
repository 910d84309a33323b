"""The Pod Security Standards checker: each rule rejects its own failing fixture (and only that
rule fires), at the versions where the rule exists, in the form of that version."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox.runtime.kubernetes.pss import RULES, violations
from tests.k8s_helpers import k8s_config, pod_objects

Pod = dict[str, Any]


@pytest.fixture(scope="module")
def good_pod(tmp_path_factory: pytest.TempPathFactory) -> Pod:
    tmp: Path = tmp_path_factory.mktemp("pss")
    return dict(pod_objects(k8s_config(tmp), "coder")[-1])


def _set(path: str, value: Any) -> Callable[[Pod], None]:
    def mutate(pod: Pod) -> None:
        target: Any = pod
        *parents, last = path.split(".")
        for key in parents:
            target = target[int(key)] if key.isdigit() else target.setdefault(key, {})
        target[last] = value

    return mutate


def _drop_seccomp(pod: Pod) -> None:
    del pod["spec"]["securityContext"]["seccompProfile"]


def _drop_run_as_non_root(pod: Pod) -> None:
    del pod["spec"]["securityContext"]["runAsNonRoot"]
    for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        del container["securityContext"]["runAsNonRoot"]


def _add_volume(volume: dict[str, Any]) -> Callable[[Pod], None]:
    return lambda pod: pod["spec"]["volumes"].append(volume)


def _annotate(key: str, value: str) -> Callable[[Pod], None]:
    return lambda pod: pod["metadata"]["annotations"].__setitem__(key, value)


C = "spec.containers.0"
# rule id -> (a mutation that breaks only that rule, the version it is checked at)
FIXTURES: dict[str, tuple[Callable[[Pod], None], str]] = {
    "windowsHostProcess": (_set("spec.securityContext.windowsOptions", {"hostProcess": True}), "v1.33"),
    "hostNamespaces": (_set("spec.hostPID", True), "v1.33"),
    "privileged": (_set(f"{C}.securityContext.privileged", True), "v1.33"),
    "capabilities_baseline": (_set(f"{C}.securityContext.capabilities.add", ["SYS_ADMIN"]), "v1.33"),
    "hostPathVolumes": (_add_volume({"name": "h", "hostPath": {"path": "/"}}), "v1.33"),
    "hostPorts": (_set(f"{C}.ports", [{"containerPort": 80, "hostPort": 80}]), "v1.33"),
    "hostProbesAndHostLifecycle": (
        _set(f"{C}.livenessProbe", {"httpGet": {"host": "10.0.0.1", "port": 80}}),
        "v1.34",
    ),
    "appArmorProfile": (_set(f"{C}.securityContext.appArmorProfile", {"type": "Unconfined"}), "v1.33"),
    "seLinuxOptions": (_set(f"{C}.securityContext.seLinuxOptions", {"type": "spc_t"}), "v1.33"),
    "procMount": (_set(f"{C}.securityContext.procMount", "Unmasked"), "v1.33"),
    "seccompProfile_baseline": (_set("spec.securityContext.seccompProfile", {"type": "Unconfined"}), "v1.33"),
    "sysctls": (_set("spec.securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]), "v1.33"),
    "restrictedVolumes": (_add_volume({"name": "n", "nfs": {"server": "nfs", "path": "/"}}), "v1.33"),
    "allowPrivilegeEscalation": (_set(f"{C}.securityContext.allowPrivilegeEscalation", True), "v1.33"),
    "runAsNonRoot": (_drop_run_as_non_root, "v1.33"),
    "runAsUser": (_set(f"{C}.securityContext.runAsUser", 0), "v1.33"),
    "seccompProfile_restricted": (_drop_seccomp, "v1.33"),
    "capabilities_restricted": (_set(f"{C}.securityContext.capabilities", {"drop": ["NET_RAW"]}), "v1.33"),
    "procMount_restricted": (_set(f"{C}.securityContext.procMount", "Unmasked"), "v1.35"),
}


def test_every_rule_has_a_failing_fixture() -> None:
    assert set(FIXTURES) == {rule.id for rule in RULES}


@pytest.mark.parametrize("rule_id", sorted(FIXTURES))
def test_each_rule_rejects_its_fixture(good_pod: Pod, rule_id: str) -> None:
    mutate, version = FIXTURES[rule_id]
    assert violations(good_pod, "restricted", version) == []
    bad = copy.deepcopy(good_pod)
    mutate(bad)
    level = next(rule.level for rule in RULES if rule.id == rule_id)
    fired = {v.split(":", 1)[0] for v in violations(bad, level, version)}
    # restricted rules that override a baseline one replace it: only the restricted id fires
    assert rule_id in fired, violations(bad, level, version)
    if level == "baseline":
        assert violations(bad, "baseline", version), rule_id


def test_a_rule_applies_only_from_its_version(good_pod: Pod) -> None:
    probe = copy.deepcopy(good_pod)
    FIXTURES["hostProbesAndHostLifecycle"][0](probe)
    assert violations(probe, "baseline", "v1.33") == []
    assert violations(probe, "baseline", "v1.34")
    root = copy.deepcopy(good_pod)
    FIXTURES["runAsUser"][0](root)
    assert [v for v in violations(root, "restricted", "v1.22") if v.startswith("runAsUser")] == []
    assert [v for v in violations(root, "restricted", "v1.23") if v.startswith("runAsUser")]


def test_sysctls_follow_the_safe_set_of_each_version(good_pod: Pod) -> None:
    pod = copy.deepcopy(good_pod)
    _set("spec.securityContext.sysctls", [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"}])(pod)
    assert violations(pod, "baseline", "v1.31")
    assert violations(pod, "baseline", "v1.32") == []


def test_a_pod_in_its_own_user_namespace_may_run_as_root_from_1_35(good_pod: Pod) -> None:
    pod = copy.deepcopy(good_pod)
    FIXTURES["runAsUser"][0](pod)
    pod["spec"]["hostUsers"] = False
    assert [v for v in violations(pod, "restricted", "v1.34") if v.startswith("runAsUser")]
    assert [v for v in violations(pod, "restricted", "v1.35") if v.startswith("runAsUser")] == []


def test_apparmor_and_seccomp_annotations_are_read(good_pod: Pod) -> None:
    pod = copy.deepcopy(good_pod)
    _annotate("container.apparmor.security.beta.kubernetes.io/sandbox", "unconfined")(pod)
    assert any(v.startswith("appArmorProfile") for v in violations(pod, "baseline", "v1.33"))
    pod = copy.deepcopy(good_pod)
    _annotate("seccomp.security.alpha.kubernetes.io/pod", "unconfined")(pod)
    assert any(v.startswith("seccompProfile_baseline") for v in violations(pod, "baseline", "v1.33"))


def test_init_containers_are_checked_too(good_pod: Pod) -> None:
    pod = copy.deepcopy(good_pod)
    assert pod["spec"]["initContainers"], "the rw workspace has a protect step"
    pod["spec"]["initContainers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    assert violations(pod) == [
        "allowPrivilegeEscalation: initContainers[protect].allowPrivilegeEscalation is not false"
    ]


def test_templates_of_workloads_are_checked() -> None:
    deployment = {
        "kind": "Deployment",
        "spec": {"template": {"metadata": {}, "spec": {"containers": [{"name": "c", "securityContext": {}}]}}},
    }
    ids = {v.split(":", 1)[0] for v in violations(deployment)}
    assert {"allowPrivilegeEscalation", "runAsNonRoot", "seccompProfile_restricted", "capabilities_restricted"} <= ids
    assert violations({"kind": "Service", "spec": {}}) == []
