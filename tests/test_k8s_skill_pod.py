"""A skill call's objects on a cluster, as data: the folder's ConfigMap and the one-shot Pod
(kubernetes/skill_pod.py). The Pods run in tests/test_k8s_skills_docker.py."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from sandbox.errors import SandboxUnavailable
from sandbox.runtime.kubernetes import skill_pod
from sandbox.runtime.kubernetes.names import K8sLabels
from sandbox.runtime.kubernetes.pod import ProxyRef, workspace_claim_name
from sandbox.runtime.kubernetes.proxy_ca import ca_placeholder
from sandbox.runtime.kubernetes.pss import violations
from sandbox.runtime.kubernetes.tenant import Orchestrator, tenant_objects
from sandbox.runtime.skill_spec import SkillCall
from tests.k8s_helpers import k8s_config, spec_of


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "skills" / "tally"
    (folder / "lib").mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: tally\ndescription: x\n---\n")
    (folder / "handler.py").write_text("print('ok')\n")
    (folder / "lib" / "helper.py").write_bytes(b"\x00\xffbinary is kept\n")
    return folder


def _call(folder: Path, read: tuple[str, ...] = (), write: tuple[str, ...] = (), network: bool = False) -> SkillCall:
    return SkillCall("tally", folder, read, write, network, "call-1")


def _pod(tmp_path: Path, agent: str, call: SkillCall, **kw: Any) -> dict[str, Any]:
    config = k8s_config(tmp_path)
    session = spec_of(config, agent)
    files = skill_pod.folder_files(call.folder)
    config_map = skill_pod.folder_config_map("sbx-acme", session.tenant, call.skill, files)
    granted = kw.pop("granted", skill_pod.grants(session, call))
    return skill_pod.skill_pod(
        session,
        call,
        config.runtime.kubernetes,
        "sbx-acme",
        folder=skill_pod.folder_volume(config_map, files),
        granted=granted,
        timeout_s=30,
        **kw,
    )


def _mounts(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    paths = [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]
    assert len(paths) == len(set(paths)), paths  # the API refuses a Pod with two mounts at one path
    used = {m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert used == {v["name"] for v in pod["spec"]["volumes"]}  # no volume left unmounted
    return {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}


def test_the_folder_travels_as_a_content_named_immutable_config_map(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    files = skill_pod.folder_files(folder)
    assert sorted(files) == ["SKILL.md", "handler.py", "lib/helper.py"]
    made = skill_pod.folder_config_map("sbx-acme", "acme", "tally", files)
    assert made["immutable"] is True and made["metadata"]["name"].startswith("skill-tally-")
    volume = skill_pod.folder_volume(made, files)
    back = {item["path"]: base64.b64decode(made["binaryData"][item["key"]]) for item in volume["configMap"]["items"]}
    assert back == files  # every file at its path, bytes as they are
    assert volume["configMap"]["defaultMode"] == 0o555  # read-only; a helper script stays runnable
    # the same content is the same ConfigMap; a changed skill is another one
    assert (
        skill_pod.folder_config_map("sbx-acme", "acme", "tally", dict(files))["metadata"]["name"]
        == (made["metadata"]["name"])
    )
    (folder / "handler.py").write_text("print('changed')\n")
    changed = skill_pod.folder_config_map("sbx-acme", "acme", "tally", skill_pod.folder_files(folder))
    assert changed["metadata"]["name"] != made["metadata"]["name"]
    for version in ("1.33", "1.37"):
        kubernetes_validate.validate(made, version, strict=True)


def test_a_link_in_the_folder_is_refused_not_followed(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (tmp_path / "host-secret").write_text("orchestrator's")
    os.symlink(tmp_path / "host-secret", folder / "config.txt")
    with pytest.raises(SandboxUnavailable, match=r"config\.txt is not a regular file"):
        skill_pod.folder_files(folder)


def test_a_folder_past_what_a_config_map_carries_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "big.bin").write_bytes(os.urandom(skill_pod.MAX_FOLDER_BYTES))
    with pytest.raises(SandboxUnavailable, match="larger than a ConfigMap carries"):
        skill_pod.folder_files(folder)


@pytest.mark.parametrize("agent", ["scratch", "reader", "coder", "team", "web"])
@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_every_skill_pod_passes_restricted_and_the_strict_schema(tmp_path: Path, agent: str) -> None:
    call = _call(_folder(tmp_path), read=("/workspace/**",), write=("/workspace/out/**",), network=agent == "web")
    proxy = None
    if agent == "web":
        session = spec_of(k8s_config(tmp_path), agent)
        assert session.egress is not None
        proxy = ProxyRef("10.96.7.7", ca_placeholder(session.egress))
    pod = _pod(tmp_path, agent, call, node="node-a", proxy=proxy)
    assert violations(pod, "restricted", "v1.33") == []
    for version in ("1.33", "1.37"):
        kubernetes_validate.validate(pod, version, strict=True)
    assert pod["metadata"]["labels"][K8sLabels.KIND] == "skill"
    assert pod["spec"]["activeDeadlineSeconds"] >= 30 + skill_pod.LIFETIME_GRACE_S  # ends by itself
    assert _mounts(pod)["/opt/skill"]["readOnly"] is True
    assert "hostPath" not in str(pod["spec"]["volumes"])


def test_only_the_declared_paths_of_the_claim_are_mounted(tmp_path: Path) -> None:
    config = k8s_config(tmp_path)
    call = _call(_folder(tmp_path), read=("/workspace/src/*.py",), write=("/workspace/out/**",))
    pod = _pod(tmp_path, "coder", call, node="node-a")
    mounts = _mounts(pod)
    assert mounts["/workspace/src"]["subPath"] == "src" and mounts["/workspace/src"]["readOnly"] is True
    assert mounts["/workspace/out"]["subPath"] == "out" and mounts["/workspace/out"]["readOnly"] is False
    claim = next(v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v)
    assert claim["persistentVolumeClaim"]["claimName"] == workspace_claim_name(spec_of(config, "coder"))
    # the rest of /workspace is the Pod's own scratch, not the claim
    scratch = next(v for v in pod["spec"]["volumes"] if v["name"] == mounts["/workspace"]["name"])
    assert "emptyDir" in scratch
    # a ReadWriteOnce claim is mounted on the session's node only
    assert pod["spec"]["nodeName"] == "node-a"


def test_a_skill_never_gets_more_than_its_session(tmp_path: Path) -> None:
    call = _call(_folder(tmp_path), write=("/workspace/**",))
    ro = _mounts(_pod(tmp_path, "reader", call))  # the session's workspace is read-only
    assert ro["/workspace"]["readOnly"] is True and "subPath" not in ro["/workspace"]
    # scratch (workspace_access none) is the session Pod's emptyDir: no other Pod can mount it
    scratch = _pod(tmp_path, "scratch", call)
    assert not [v for v in scratch["spec"]["volumes"] if "persistentVolumeClaim" in v]
    # protected paths stay read-only inside a writable grant
    rw = _mounts(_pod(tmp_path, "coder", call))
    assert rw["/workspace"]["readOnly"] is False
    assert rw["/workspace/.git/hooks"] == {
        "name": skill_pod.CLAIM_VOLUME,
        "mountPath": "/workspace/.git/hooks",
        "subPath": ".git/hooks",
        "readOnly": True,
    }
    # a grant of a protected path itself, or of a path inside one, is read-only
    for declared in ("/workspace/.git/hooks/**", "/workspace/.git/hooks/sub/**", "/workspace/.git/config"):
        inside = _mounts(_pod(tmp_path, "coder", _call(call.folder, write=(declared,))))
        assert inside[declared.removesuffix("/**")]["readOnly"] is True, declared
    # paths outside the workspace are not on the claim: nothing is mounted for them
    outside = _pod(tmp_path, "coder", _call(call.folder, read=("/etc/**",)))
    assert not [v for v in outside["spec"]["volumes"] if "persistentVolumeClaim" in v]


def test_the_grants_step_records_each_sub_path_where_the_sandbox_reads_it(tmp_path: Path) -> None:
    """A skill Pod with sub-path grants records their identities in an init step that mounts the
    claim read-only (no session or skill code runs there); the sandbox reads them read-only."""
    pod = _pod(tmp_path, "coder", _call(_folder(tmp_path), read=("/workspace/src/**",), write=("/workspace/out/**",)))
    step = next(c for c in pod["spec"]["initContainers"] if c["name"] == "grants")
    assert step["command"][-2:] == ["out", "src"]
    views = {m["mountPath"]: m for m in step["volumeMounts"]}
    assert views[skill_pod.CLAIM_VIEW]["readOnly"] is True and "subPath" not in views[skill_pod.CLAIM_VIEW]
    assert _mounts(pod)[skill_pod.GRANTS_DIR]["readOnly"] is True
    assert skill_pod.CLAIM_VIEW not in _mounts(pod)  # the sandbox never sees the whole claim
    # the whole claim granted: nothing to race, no step
    whole = _pod(tmp_path, "coder", _call(_folder(tmp_path / "2"), read=("/workspace/**",)))
    assert "grants" not in [c["name"] for c in whole["spec"].get("initContainers") or []]


def test_no_network_declared_means_no_proxy_and_no_egress_label(tmp_path: Path) -> None:
    pod = _pod(tmp_path, "web", _call(_folder(tmp_path), read=("/workspace/**",)))
    assert K8sLabels.EGRESS not in pod["metadata"]["labels"]  # the deny-all policy alone holds it
    env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert not {"HTTP_PROXY", "HTTPS_PROXY"} & env


def test_the_role_may_create_config_maps_only_when_skills_are_configured(tmp_path: Path) -> None:
    def granted(extra: str) -> set[tuple[str, str]]:
        config = k8s_config(tmp_path, extra=extra)
        role = next(o for o in tenant_objects(config, config.tenants[0], Orchestrator()) if o["kind"] == "Role")
        return {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}

    assert not {r for r, _ in granted("") if r == "configmaps"}
    _folder(tmp_path)
    with_skills = granted(f"skills: {{dirs: ['{tmp_path / 'skills'}']}}")
    assert {verb for r, verb in with_skills if r == "configmaps"} == {"create"}  # never read, changed or deleted
