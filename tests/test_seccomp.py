"""The built-in strict seccomp profile as data: what it allows, what it leaves out, how it is wired."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sandbox.audit.spellings import seccomp_weakness
from sandbox.config import load_config_text
from sandbox.runtime import seccomp
from sandbox.runtime.docker.create import create_kwargs
from sandbox.runtime.spec import spec_from_config

# what an attacker in the sandbox would reach for; none may be allowed
NEVER = [
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "unshare", "setns", "mount", "umount2", "pivot_root",
    "chroot", "fsopen", "fsmount", "open_tree", "move_mount", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "open_by_handle_at", "name_to_handle_at", "clock_settime", "settimeofday", "socketcall",
    "socket", "socketpair", "clone", "clone3", "personality", "iopl", "ioperm", "acct", "quotactl", "syslog",
]  # fmt: skip


def profile() -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(seccomp.strict_profile_json())
    return parsed


def rules_for(name: str) -> list[dict[str, Any]]:
    return [r for r in profile()["syscalls"] if name in r["names"]]


def test_strict_profile_denies_by_default() -> None:
    """Whatever the allowlist does not name is EPERM, and the audit finds nothing weak in it."""
    p = profile()
    assert p["defaultAction"] == "SCMP_ACT_ERRNO" and p["defaultErrnoRet"] == seccomp.EPERM
    assert seccomp_weakness(seccomp.strict_profile_json()) is None


def test_dangerous_syscalls_are_never_unconditionally_allowed() -> None:
    """Namespaces, ptrace, io_uring, bpf, keyrings, modules and the like are not on the allowlist."""
    allowed = set(seccomp.ALLOWED_SYSCALLS)
    assert allowed.isdisjoint(NEVER), sorted(allowed & set(NEVER))


def test_socket_is_allowed_for_listed_families_only() -> None:
    """socket() rules match IP and netlink families exactly (no "not AF_UNIX": high bits would pass)."""
    rules = rules_for("socket")
    assert all(r["action"] == "SCMP_ACT_ALLOW" for r in rules)
    assert [r["args"] for r in rules] == [[{"index": 0, "value": f, "op": "SCMP_CMP_EQ"}] for f in (2, 10, 16)]
    assert "socket" not in seccomp.ALLOWED_SYSCALLS


def test_socketpair_only_for_connected_types() -> None:
    """socketpair() is allowed for stream and seqpacket pairs (flags free), never datagram ones."""
    rules = rules_for("socketpair")
    conds = [r["args"] for r in rules]
    assert conds == [[{"index": 1, "value": 0xF, "valueTwo": kind, "op": "SCMP_CMP_MASKED_EQ"}] for kind in (1, 5)]
    assert "socketpair" not in seccomp.ALLOWED_SYSCALLS


def test_clone_cannot_make_namespaces_and_clone3_falls_back() -> None:
    """clone is allowed only with no namespace flag (user namespaces included); clone3 is ENOSYS."""
    [clone] = rules_for("clone")
    [cond] = clone["args"]
    assert cond["op"] == "SCMP_CMP_MASKED_EQ" and cond["valueTwo"] == 0
    assert cond["value"] & 0x10000000  # CLONE_NEWUSER
    [clone3] = rules_for("clone3")
    assert clone3["action"] == "SCMP_ACT_ERRNO" and clone3["errnoRet"] == seccomp.ENOSYS


def test_only_native_architectures() -> None:
    """No 32-bit or x32 entry point (socketcall would hide the socket family from the filter)."""
    assert all(a["subArchitectures"] == [] for a in profile()["archMap"])


def test_personality_allows_only_listed_values() -> None:
    """personality() takes a few harmless values, never ADDR_NO_RANDOMIZE."""
    values = {r["args"][0]["value"] for r in rules_for("personality")}
    assert values == set(seccomp.PERSONALITIES) and 0x0040000 not in values


def make(tmp_path: Path, docker: str = "") -> Any:
    text = f"state_dir: {tmp_path / 'state'}\nagents: {{defaults: {{sandbox: {{mode: all{docker}}}}}}}\n"
    return load_config_text(text, source="t.yaml", base_dir=tmp_path)


def spec_of(cfg: Any) -> Any:
    from sandbox.config.merge import effective_agent

    return spec_from_config(cfg, effective_agent(cfg, "main"), "agent:main:x", "inst")


def test_default_config_creates_containers_with_the_strict_profile(tmp_path: Path) -> None:
    """No setting means strict: the inline profile goes to the engine; `default` leaves the engine's own."""
    strict = create_kwargs(spec_of(make(tmp_path)))["security_opt"]
    assert f"seccomp={seccomp.strict_profile_json()}" in strict
    engine = create_kwargs(spec_of(make(tmp_path, ", docker: {seccomp_profile: default}")))["security_opt"]
    assert not any(o.startswith("seccomp=") for o in engine)


def test_profile_choice_and_version_are_part_of_the_sandbox_identity(tmp_path: Path) -> None:
    """Switching profiles (or a new allowlist version) recreates sandboxes instead of reusing them."""
    a = spec_of(make(tmp_path)).config_hash
    b = spec_of(make(tmp_path, ", docker: {seccomp_profile: default}")).config_hash
    assert a != b
    assert seccomp.seccomp_identity("strict") == f"strict:v{seccomp.PROFILE_VERSION}"
    assert "AF_UNIX" in seccomp.seccomp_label("strict") and "engine default" in seccomp.seccomp_label(None)


def test_security_opts_are_described_not_dumped() -> None:
    """explain and the demo name the inline profile instead of printing its JSON."""
    opts = ["no-new-privileges:true", f"seccomp={seccomp.strict_profile_json()}"]
    shown = seccomp.describe_security_opts(opts)
    assert shown[0] == "no-new-privileges:true" and shown[1].startswith("seccomp=strict (built-in v")
    assert seccomp.describe_security_opts(["seccomp=unconfined"]) == ["seccomp=unconfined"]
    assert "engine default" in seccomp.describe_security_opts([])[0]
    assert "custom profile" in seccomp.describe_security_opts(['seccomp={"defaultAction": "x"}'])[0]
