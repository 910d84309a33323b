"""The audit reads meaning, not spelling: root as `-0`, seccomp that allows everything, namespaces
joined from other containers, volumes that are binds, egress, env secrets, host sessions, the
built-in defaults (issue 16 items 12, 13, 14, 16), on inspect documents and on configs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from sandbox.audit.config_rules import audit_config
from sandbox.audit.container_rules import audit_container
from sandbox.audit.exposure_rules import INTERNAL_KEY
from sandbox.audit.mount_rules import VOLUME_DEVICE
from sandbox.audit.spellings import is_root_user, seccomp_weakness
from sandbox.config import load_config_text
from tests.test_audit_rules import GOOD

ALLOW_ALL = json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []})
ALLOW_BUT_UNSHARE = json.dumps(
    {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["unshare"], "action": "SCMP_ACT_ERRNO"}]}
)
DENY_DEFAULT = json.dumps(
    {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"}]}
)


def doc_with(**changes: Any) -> dict[str, Any]:
    """GOOD with top-level `Config.X` / `HostConfig.X` / other keys replaced."""
    doc = copy.deepcopy(GOOD)
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            doc[section][key] = value
        else:
            doc[section] = value
    return doc


def rules_of(doc: dict[str, Any], roots: list[str] | None = None) -> list[str]:
    return [f.rule for f in audit_container(doc, "c", roots or [])]


@pytest.mark.parametrize(
    ("user", "root"),
    [
        ("", True),
        ("0", True),
        ("00", True),
        ("+0", True),
        ("-0", True),
        ("0000:0000", True),
        ("0:0", True),
        ("root", True),
        ("root:1000", True),
        (" 0 ", True),
        ("1000", False),
        ("1000:0", False),
        ("sandbox", False),
        ("10", False),
        ("-1", False),
    ],
)
def test_every_spelling_of_root_is_root(user: str, root: bool) -> None:
    """`00`, `+0`, `-0`, `0000:0000`, `root`, `0:0` are uid 0 to the engine, so SBX-C027 fires."""
    assert is_root_user(user) is root
    assert ("SBX-C027" in rules_of(doc_with(Config__User=user))) is root


@pytest.mark.parametrize("user", ["00", "+0", "-0", "0000:0000", "root", "0:0"])
def test_configured_root_spelling_is_flagged(tmp_path: Path, user: str) -> None:
    """A config with `docker.user: '-0'` (any root spelling) gets SBX-C027 in the config audit."""
    config = load_config_text(
        f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{docker: {{user: '{user}'}}}}}}}}"
    )
    assert "SBX-C027" in [f.rule for f in audit_config(config, [str(tmp_path / "sandboxes")])]


@pytest.mark.parametrize(
    ("profile", "weak"),
    [
        ("unconfined", "seccomp=unconfined"),
        (ALLOW_ALL, "restricts no syscall"),
        (ALLOW_BUT_UNSHARE, "restricts only 1: unshare"),
        (json.dumps({"defaultAction": "SCMP_ACT_LOG"}), "restricts no syscall"),
        ("/no/such/profile.json", "not a readable JSON profile"),
        ("[1, 2]", "not a JSON object"),
        (DENY_DEFAULT, None),
        ("builtin", None),
    ],
)
def test_seccomp_profile_is_judged_by_content(profile: str, weak: str | None) -> None:
    """A profile whose defaultAction allows is unconfined in effect (SBX-C005); default-deny passes."""
    found = seccomp_weakness(profile)
    assert (found is None) if weak is None else (found is not None and weak in found)
    doc = doc_with(HostConfig__SecurityOpt=["no-new-privileges:true", f"seccomp={profile}"])
    assert ("SBX-C005" in rules_of(doc)) is (weak is not None)


def test_configured_allow_all_seccomp_file_is_flagged(tmp_path: Path) -> None:
    """`seccomp_profile: allow.json` with SCMP_ACT_ALLOW is flagged; a missing file is flagged too."""
    allow = tmp_path / "allow.json"
    allow.write_text(ALLOW_ALL)
    for path in (allow, tmp_path / "missing.json"):
        config = load_config_text(
            f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{docker: {{seccomp_profile: '{path}'}}}}}}}}"
        )
        c005 = [f for f in audit_config(config, [str(tmp_path / "sandboxes")]) if f.rule == "SBX-C005"]
        assert len(c005) == 1, path


@pytest.mark.parametrize(("key", "rule"), [("PidMode", "SBX-C010"), ("IpcMode", "SBX-C011"), ("UTSMode", "SBX-C012")])
def test_joining_another_containers_namespace_is_flagged(key: str, rule: str) -> None:
    """`--pid container:<id>` (read its /proc/*/environ) and `--ipc container:<id>` are high findings."""
    found = audit_container(doc_with(**{f"HostConfig__{key}": "container:0123abcd"}), "c")
    assert [(f.rule, f.severity) for f in found] == [(rule, "high")]
    assert "container:0123abcd" in found[0].evidence


def test_volume_bound_to_etc_is_a_sensitive_mount() -> None:
    """A local volume whose driver options bind /etc is judged as a bind of /etc (SBX-M003)."""
    volume = {
        "Type": "volume",
        "Name": "innocent",
        "Source": "/var/lib/docker/volumes/innocent/_data",
        "Destination": "/data",
        "RW": False,
        VOLUME_DEVICE: "/etc",
    }
    found = audit_container(doc_with(Mounts=[*GOOD["Mounts"], volume]), "c")
    assert [f.rule for f in found] == ["SBX-M003"] and "volume innocent (device /etc)" in found[0].evidence
    plain = {k: v for k, v in volume.items() if k != VOLUME_DEVICE}  # an ordinary named volume is no bind
    assert audit_container(doc_with(Mounts=[*GOOD["Mounts"], plain]), "c") == []


def test_bridge_network_is_egress() -> None:
    """`network: bridge` reaches the internet and the host gateway: SBX-C028; internal networks do not."""
    assert rules_of(doc_with(HostConfig__NetworkMode="bridge")) == ["SBX-C028"]
    assert rules_of(doc_with(HostConfig__NetworkMode="default")) == ["SBX-C028"]
    outside = doc_with(HostConfig__NetworkMode="mynet")
    outside[INTERNAL_KEY] = []
    assert rules_of(outside) == ["SBX-C028"]
    inside = doc_with(HostConfig__NetworkMode="mynet")
    inside[INTERNAL_KEY] = ["mynet"]
    assert rules_of(inside) == []


def test_configured_bridge_network_is_flagged(tmp_path: Path) -> None:
    """`docker.network: bridge` in a config is flagged by the config audit."""
    config = load_config_text(
        f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{docker: {{network: bridge}}}}}}}}"
    )
    assert "SBX-C028" in [f.rule for f in audit_config(config, [str(tmp_path / "sandboxes")])]


def test_secrets_in_docker_env_are_flagged_by_name_only(tmp_path: Path) -> None:
    """An API key in docker.env is visible to every session: SBX-C029 names it and never shows its value."""
    secret = "sk-proj-" + "A1b2C3d4" * 4
    config = load_config_text(
        f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{docker: {{env: "
        f"{{LANG: C.UTF-8, OPENAI_API_KEY: {secret}, HELPER: 'ghp_{'x' * 30}', DEBUG: '1'}}}}}}}}}}"
    )
    found = [f for f in audit_config(config, [str(tmp_path / "sandboxes")]) if f.rule == "SBX-C029"]
    assert len(found) == 1 and found[0].severity == "high"
    assert "HELPER, OPENAI_API_KEY" in found[0].evidence and secret not in found[0].evidence
    assert "LANG" not in found[0].evidence and "DEBUG" not in found[0].evidence


def test_host_main_session_of_non_main_is_info(tmp_path: Path) -> None:
    """mode non-main: the main session runs exec on the host (SBX-P004 info); mode all: no finding."""
    non_main = load_config_text(f"state_dir: {tmp_path}\nagents: {{list: [{{id: a}}]}}")
    p004 = [f for f in audit_config(non_main, []) if f.rule == "SBX-P004"]
    assert len(p004) == 1 and p004[0].severity == "info" and "'exec'" in p004[0].evidence
    every = load_config_text(f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{mode: all}}}}}}")
    assert "SBX-P004" not in [f.rule for f in audit_config(every, [])]


def test_builtin_defaults_are_flagged_when_no_config_is_given(tmp_path: Path) -> None:
    """The CLI's built-in defaults (no config) give the host main session every tool: SBX-P005 medium."""
    defaults = load_config_text("{}", source="<defaults>", base_dir=tmp_path)
    p005 = [f for f in audit_config(defaults, []) if f.rule == "SBX-P005"]
    assert len(p005) == 1 and p005[0].severity == "medium" and "exec" in p005[0].evidence
    configured = load_config_text(f"state_dir: {tmp_path}\ntools: {{deny: [exec]}}")
    assert "SBX-P005" not in [f.rule for f in audit_config(configured, [])]
