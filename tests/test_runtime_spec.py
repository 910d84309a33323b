"""The container spec from config (pure): names, labels, hashes and hardened create arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sandbox.config import effective_agent, load_config_text
from sandbox.runtime.docker.create import SHIM_GROUP, SHIM_SHARDS, create_kwargs, groups_shims
from sandbox.runtime.docker.doctor import shim_check
from sandbox.runtime.naming import Labels, container_name
from sandbox.runtime.seccomp import strict_profile_json
from sandbox.runtime.spec import build_spec, volume_name
from sandbox.runtime.workspace_ref import HostFolder, Volume


def spec_for(text: str, session: str = "agent:main:s", tmp: Path = Path("/tmp/sbx-spec")) -> Any:
    config = load_config_text(f"state_dir: {tmp}\n{text}")
    return build_spec(effective_agent(config, "main"), session, "inst1")


@given(
    st.text(min_size=1, max_size=300),
    st.sampled_from(["exec", "browser"]),
    st.text(alphabet="abc0123-", min_size=1, max_size=16),
)
def test_names_fit_and_differ(key: str, kind: str, instance: str) -> None:
    """Names are <= 63 chars of [a-z0-9-] and differ across instance, kind and key."""
    name = container_name(instance, kind, key, tenant="t")
    assert len(name) <= 63
    assert name != container_name(instance + "x", kind, key, tenant="t")
    assert name != container_name(instance, kind, key + "x", tenant="t")


def test_hardened_defaults_in_create_kwargs() -> None:
    """The defaults are the hardened choices, spelled out for the engine."""
    kwargs = create_kwargs(spec_for(""))
    assert kwargs["network_mode"] == "none"
    assert kwargs["cap_drop"] == ["ALL"] and "cap_add" not in kwargs
    assert kwargs["security_opt"] == ["no-new-privileges:true", f"seccomp={strict_profile_json()}"]
    assert kwargs["read_only"] is True
    assert kwargs["pids_limit"] == 256
    assert kwargs["mem_limit"] == kwargs["memswap_limit"] == 1024**3
    assert kwargs["nano_cpus"] == 10**9
    assert kwargs["init"] is True
    assert kwargs["restart_policy"] == {"Name": "no"}
    assert kwargs["user"] == "1000:1000"
    assert "ports" not in kwargs
    assert all("size=" in v for v in kwargs["tmpfs"].values())


def test_labels_carry_the_inventory() -> None:
    """Labels name instance, tenant, agent, scope key, hash, times and schema."""
    spec = spec_for("agents: {defaults: {sandbox: {scope: session}}}")
    labels = spec.labels()
    assert labels[Labels.INSTANCE] == "inst1" and labels[Labels.SCOPE_KEY] == "agent:main:s"
    assert labels[Labels.SESSION] == "agent:main:s" and labels[Labels.CONFIG_HASH] == spec.config_hash
    for key in (Labels.TENANT, Labels.AGENT, Labels.CREATED_AT, Labels.LAST_USED, Labels.SCHEMA):
        assert labels[key]


def test_the_workspace_is_named_by_reference(tmp_path: Path) -> None:
    """An rw or ro workspace and a scratch one are host folders (the real path the engine mounts);
    a `workspace_store: volume` one is a volume by name, with no host path, never pooled."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    own = spec_for(
        f"agents: {{defaults: {{workspace: {tmp_path}/link, sandbox: {{workspace_access: rw}}}}}}", tmp=tmp_path
    )
    assert own.workspace == HostFolder(tmp_path / "real") and own.mounts[0].source == own.workspace.source
    assert not own.mounts[0].volume and own.scratch_folder is None
    scratch = spec_for("agents: {defaults: {sandbox: {scope: session}}}", tmp=tmp_path)
    assert isinstance(scratch.workspace, HostFolder) and scratch.mounts[0].source == scratch.workspace.source
    assert scratch.scratch_folder == scratch.workspace.path and scratch.pool_key is not None
    volume = spec_for("agents: {defaults: {sandbox: {scope: session, workspace_store: volume}}}", tmp=tmp_path)
    assert volume.workspace == Volume(volume_name("inst1", volume.tenant, "agent:main:s"))
    assert volume.mounts[0].source == volume.workspace.source and volume.mounts[0].volume
    assert volume.workspace.host_path is None and own.workspace.host_path == tmp_path / "real"
    assert volume.scratch_folder is None and volume.pool_key is None and volume.user == "1000:1000"


def test_scope_keys() -> None:
    """session -> the session key; agent -> agent:<id>; shared -> shared."""
    assert spec_for("agents: {defaults: {sandbox: {scope: session}}}").scope_key == "agent:main:s"
    assert spec_for("agents: {defaults: {sandbox: {scope: agent}}}").scope_key == "agent:main"
    assert spec_for("agents: {defaults: {sandbox: {scope: shared}}}").scope_key == "shared"


def test_a_spec_hashes_once_and_a_changed_copy_hashes_anew(tmp_path: Path) -> None:
    """The config hash is computed once per spec (identity is asked several times per call); a
    copy with other settings (dataclasses.replace) gets its own hash, never the original's."""
    import dataclasses
    import hashlib
    import json

    spec = spec_for("", tmp=tmp_path)
    first = spec.identity
    assert spec.identity == first and spec.__dict__["config_hash"] == spec.config_hash
    changed = dataclasses.replace(spec, hashed={**spec.hashed, "env": {"A": "b"}})
    expected = hashlib.sha256(json.dumps(changed.hashed, sort_keys=True).encode()).hexdigest()[:16]
    assert changed.config_hash == expected != spec.config_hash and changed.identity != first


def test_hash_changes_with_what_matters_only(tmp_path: Path) -> None:
    """env, binds, limits, user, network, runtime, setup change the hash; a session key in agent scope does not."""
    base = spec_for("", tmp=tmp_path).config_hash
    assert spec_for("", session="agent:main:other", tmp=tmp_path).config_hash == base
    (tmp_path / "d").mkdir()
    for change in (
        "agents: {defaults: {sandbox: {docker: {env: {A: b}}}}}",
        f"agents: {{defaults: {{sandbox: {{docker: {{binds: ['{tmp_path}/d:/mnt/d']}}}}}}}}",
        "agents: {defaults: {sandbox: {docker: {pids_limit: 100}}}}",
        "agents: {defaults: {sandbox: {docker: {user: '2000:2000'}}}}",
        "agents: {defaults: {sandbox: {docker: {network: bridge}}}}",
        "agents: {defaults: {sandbox: {docker: {runtime: runsc}}}}",
        "agents: {defaults: {sandbox: {docker: {setup_command: 'true'}}}}",
        "agents: {defaults: {sandbox: {workspace_access: ro}}}",
        "agents: {defaults: {sandbox: {docker: {shim: container}}}}",
    ):
        assert spec_for(change, tmp=tmp_path).config_hash != base, change


def group_of(tenant: str, runtime: str | None = None, session: str = "agent:main:s", **docker: str) -> str | None:
    config = load_config_text(
        "state_dir: /tmp/sbx-spec\n"
        f"agents: {{list: [{{id: main, tenant: '{tenant}', sandbox: {{scope: session, docker: {dict(docker, runtime=runtime)!r}}}}}]}}"
    )
    spec = build_spec(effective_agent(config, "main"), session, "inst1")
    annotations = create_kwargs(spec).get("annotations")
    return None if annotations is None else str(annotations[SHIM_GROUP])


def test_a_shim_group_is_one_of_a_few_per_tenant_and_runtime_and_never_two_tenants() -> None:
    """By default a sandbox names one of its tenant's SHIM_SHARDS shim groups, picked by its
    session; another tenant (even one whose name another's would run into if joined) and another
    runtime never share one; `shim: container` names none."""
    group = group_of("acme")
    assert group is not None and group.startswith("sbx-inst1-shim-") and "acme" not in group
    assert group == group_of("acme") != group_of("globex")
    assert group_of("acme", "runsc") not in (group, group_of("globex", "runsc"))
    assert group_of("acmer", None) != group_of("acme", "r")  # [tenant, runtime] is encoded, not glued
    assert group_of("acme", shim="container") is None
    sessions = [f"agent:main:s{n}" for n in range(64)]
    mine = {group_of("acme", session=s) for s in sessions}
    theirs = {group_of("globex", session=s) for s in sessions}
    assert len(mine) == len(theirs) == SHIM_SHARDS and not mine & theirs
    assert len({str(g).rsplit("-", 1)[0] for g in mine}) == 1  # one tenant's shards, one prefix


def test_groups_shims_only_from_api_1_43() -> None:
    """Engine 24.0 speaks API 1.43; anything older, or unreadable, gets a shim per container."""
    for version, groups in {
        "1.43": True,
        "1.45": True,
        "1.100": True,
        "2.0": True,
        "1.41": False,
        "1.9": False,
        "0.99": False,
        "": False,
        "1": False,
        "x.y": False,
    }.items():
        assert groups_shims(version) is groups, version


def test_doctor_says_whether_a_tenants_sandboxes_share_a_shim() -> None:
    """doctor: shared per tenant from API 1.43; before, one each and what would share them; none asked, none."""
    config = load_config_text("state_dir: /tmp/sbx-spec\nagents: {list: [{id: a}, {id: b}]}")
    assert "per tenant" in shim_check("1.45", config).detail
    old = shim_check("1.41", config)
    assert old.status == "ok" and "its own" in old.detail and "scripts/docker-engine" in old.detail
    off = load_config_text("state_dir: /tmp/sbx-spec\nagents: {defaults: {sandbox: {docker: {shim: container}}}}")
    assert "per sandbox" in shim_check("1.45", off).detail
