"""Isolation between agents, tenants and sessions, decided without an engine (pure, fast)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from sandbox.config import effective_agent, load_config_text
from sandbox.config.loader import semantic_problems
from sandbox.config.models import Config, FsSection
from sandbox.config.protected import is_protected
from sandbox.errors import BindRefused, ConfigError, SandboxError, UsageError
from sandbox.fs.states import FileStates
from sandbox.fs.workspace import Root, WorkspaceFiles
from sandbox.policy.sessions import SessionKeyArg, key_problem, parse_session_key
from sandbox.runtime.folders import ensure_dir, ensure_file
from sandbox.runtime.manager import SandboxManager
from sandbox.runtime.naming import container_name, scratch_dir_name
from sandbox.runtime.protected import protected_mounts
from sandbox.runtime.spec import spec_from_config
from sandbox.testing import FakeBackend

BAD_KEYS = [
    " agent:main:main ",
    "agent:main:main ",
    "main\n",
    "\tmain",
    "ma in",
    "main\x00",
    "main\x1b[2J",
    "agent:main:../x",
    "agent:main:a..b",
    "agent::main",
    "agent:main:",
    ":main",
    "a::b",
    "",
    "x" * 257,
    "agent:main:caf\u00e9",
    "agent:main:a/b",
    "agent:main:a|b",
]


def problems(text: str, tmp_path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, source="c.yaml", base_dir=tmp_path)
    return info.value.problems


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_session_keys_are_refused(key: str) -> None:
    """Whitespace, control characters, '..', empty segments, other characters and >256 chars are refused."""
    with pytest.raises(UsageError):
        parse_session_key(key, "main")


@pytest.mark.parametrize("key", ["main", "agent:main:main", "agent:main:tg:group:-100123", "a.b_c@d+e", "S1"])
def test_good_session_keys_parse(key: str) -> None:
    """Keys of the documented character set parse unchanged."""
    assert parse_session_key(key, "main").raw.endswith(key)


@given(st.text(max_size=300))
def test_no_key_that_trims_to_main_is_main(key: str) -> None:
    """No key other than `main` and `agent:main:main` themselves selects the unsandboxed main session."""
    try:
        parsed = parse_session_key(key, "main")
    except UsageError:
        return
    assert key in ("main", "agent:main:main") or not parsed.is_main
    assert key_problem(parsed.raw) is None and parsed.raw.strip() == parsed.raw


@given(st.text(alphabet="abcABC-_.:@+", min_size=1, max_size=40), st.text(alphabet="abcABC-_.:@+", max_size=40))
def test_keys_differing_in_case_or_punctuation_get_their_own_names(a: str, b: str) -> None:
    """Two different keys never map to one container name or one scratch directory, and names stay <= 63."""
    if a == b:
        return
    for tenant in ("default", "acme"):
        assert container_name("t0123456789abcde", "browser", a, tenant=tenant) != container_name(
            "t0123456789abcde", "browser", b, tenant=tenant
        )
        assert len(container_name("t0123456789abcde", "browser", a, tenant=tenant)) <= 63
        assert scratch_dir_name(tenant, a) != scratch_dir_name(tenant, b)


def test_orchestrator_session_refuses_bad_keys(tmp_path: Path) -> None:
    """Orchestrator.session refuses `" agent:main:main "` and `"main\\n"` instead of selecting main."""
    from sandbox import Orchestrator

    config = load_config_text(f"state_dir: {tmp_path}/s\ninstance: i1\n")
    orch = Orchestrator(config, journal=False)
    for key in (" agent:main:main ", "main\n", "\tmain"):
        with pytest.raises(UsageError):
            orch.session(key)
    assert orch.session("agent:main:main").sandboxed is False


def test_session_key_argument_type() -> None:
    """A tool argument typed SessionKeyArg refuses a bad key as a validation error (INVALID_ARGUMENTS)."""

    class Args(BaseModel):
        session: SessionKeyArg

    assert Args(session="agent:main:x").session == "agent:main:x"
    with pytest.raises(ValidationError):
        Args(session="main\n")


def test_tenant_is_in_names_and_scratch_paths(tmp_path: Path) -> None:
    """One scope key in two tenants gives two container names and two scratch dirs."""
    assert container_name("i", "exec", "shared", tenant="a") != container_name("i", "exec", "shared", tenant="b")
    assert scratch_dir_name("a", "agent:x") != scratch_dir_name("b", "agent:x")


def test_scratch_dir_name_is_neutral(tmp_path: Path) -> None:
    """A scratch workspace's name is a hash: nothing of the session key shows in mountinfo."""
    config = load_config_text(f"state_dir: {tmp_path}/s\nagents: {{defaults: {{sandbox: {{scope: session}}}}}}")
    spec = spec_from_config(config, effective_agent(config, "main"), "agent:main:secret-customer", "i")
    name = Path(spec.mounts[0].source).name
    assert "secret" not in name and len(name) == 32 and int(name, 16) >= 0


SHARED = """
state_dir: {tmp}/s
agents:
  defaults: {{sandbox: {{scope: shared, workspace_access: rw}}}}
  list:
    - {{id: a, workspace: {tmp}/wa}}
    - {{id: b, workspace: {tmp}/wb{extra}}}
"""


def test_shared_scope_with_different_workspaces_is_refused(tmp_path: Path) -> None:
    """Agents in scope shared with different workspaces: a located error naming both and the keys."""
    found = problems(SHARED.format(tmp=tmp_path, extra=""), tmp_path)
    assert len(found) == 1
    assert "agents.list[1].sandbox.scope" in found[0] and "'a'" in found[0] and "'b'" in found[0]
    assert "differ in workspace" in found[0] and found[0].startswith("c.yaml:")


def test_shared_scope_across_tenants_is_refused(tmp_path: Path) -> None:
    """Agents of two tenants in scope shared are refused even with one workspace setting each."""
    text = (
        f"state_dir: {tmp_path}/s\nagents:\n  defaults: {{sandbox: {{scope: shared}}}}\n"
        "  list: [{id: a, tenant: t1}, {id: b, tenant: t2}]\n"
    )
    (found,) = problems(text, tmp_path)
    assert "differ in tenant" in found and "tenants never share a container" in found


def test_shared_scope_with_differing_docker_settings_names_them(tmp_path: Path) -> None:
    """Differing binds, image or hardening are named by their key path."""
    (tmp_path / "d").mkdir()
    text = (
        f"state_dir: {tmp_path}/s\nagents:\n  defaults: {{sandbox: {{scope: shared}}}}\n  list:\n"
        "    - {id: a}\n"
        f"    - {{id: b, sandbox: {{docker: {{binds: ['{tmp_path}/d:/mnt/d'], pids_limit: 64, image: x:1}}}}}}\n"
    )
    (found,) = problems(text, tmp_path)
    for key in ("sandbox.docker.binds", "sandbox.docker.pids_limit", "sandbox.docker.image"):
        assert key in found


def test_identical_shared_agents_load(tmp_path: Path) -> None:
    """Agents whose effective sandbox is identical may share (scratch workspace, one tenant)."""
    text = (
        f"state_dir: {tmp_path}/s\nagents:\n  defaults: {{sandbox: {{scope: shared}}}}\n"
        "  list: [{id: a, tools: {deny: [exec]}}, {id: b, sandbox: {mode: all}}]\n"
    )
    load_config_text(text, base_dir=tmp_path)


@pytest.mark.parametrize(
    ("workspaces", "expect"),
    [
        (("{t}/w", "{t}/w"), "is the workspace of agent 'a'"),
        (("{t}/w", "{t}/w/sub"), "lies inside the workspace of agent 'a'"),
        (("{t}/w/sub", "{t}/w"), "contains the workspace of agent 'a'"),
    ],
)
def test_overlapping_workspaces_are_refused(tmp_path: Path, workspaces: tuple[str, str], expect: str) -> None:
    """A workspace equal to, inside or around another agent's is refused at load."""
    wa, wb = (w.format(t=tmp_path) for w in workspaces)
    text = f"state_dir: {tmp_path}/s\nagents: {{list: [{{id: a, workspace: {wa}}}, {{id: b, workspace: {wb}}}]}}"
    (found,) = problems(text, tmp_path)
    assert "agents.list[1].workspace" in found and expect in found


def test_workspace_holding_state_dir_or_workspace_root_is_refused(tmp_path: Path) -> None:
    """A workspace that holds the state dir or another agent's workspace_root is refused."""
    state = problems(f"state_dir: {tmp_path}/w/s\nagents: {{list: [{{id: a, workspace: {tmp_path}/w}}]}}", tmp_path)
    assert len(state) == 1 and "contains the state_dir" in state[0]
    text = (
        f"state_dir: {tmp_path}/s\nagents: {{list: [{{id: a, workspace: {tmp_path}/w}}, "
        f"{{id: b, workspace: {tmp_path}/wb, sandbox: {{workspace_root: {tmp_path}/w/scratch}}}}]}}"
    )
    (root,) = problems(text, tmp_path)
    assert "agents.list[0].workspace" in root and f"contains the workspace_root {tmp_path}/w/scratch" in root


def test_symlinked_workspace_alias_is_caught(tmp_path: Path) -> None:
    """Overlap is judged on real paths: a link to another agent's workspace is the same workspace."""
    (tmp_path / "w").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "w")
    text = f"state_dir: {tmp_path}/s\nagents: {{list: [{{id: a, workspace: {tmp_path}/w}}, {{id: b, workspace: {tmp_path}/alias}}]}}"
    (found,) = problems(text, tmp_path)
    assert "is the workspace of agent 'a'" in found


def _unvalidated(data: dict[str, Any], tmp_path: Path) -> Config:
    # what a program building its config in code gets: models only, no cross-key rules
    return Config.model_validate(data, context={"base_dir": tmp_path})


def test_manager_never_hands_a_container_to_another_identity(tmp_path: Path) -> None:
    """Two shared agents with different workspaces (validation skipped) map to one name; the second is refused."""
    config = _unvalidated(
        {
            "state_dir": str(tmp_path / "s"),
            "instance": "i1",
            "agents": {
                "defaults": {"sandbox": {"scope": "shared", "workspace_access": "rw", "mode": "all"}},
                "list": [
                    {"id": "a", "workspace": str(tmp_path / "wa")},
                    {"id": "b", "workspace": str(tmp_path / "wb")},
                ],
            },
        },
        tmp_path,
    )
    assert semantic_problems(config)  # loading would have refused it
    manager = SandboxManager(config, backend=FakeBackend())  # nothing is called
    spec_a = manager.spec_for(effective_agent(config, "a"), "agent:a:x")
    spec_b = manager.spec_for(effective_agent(config, "b"), "agent:b:x")
    assert spec_a.name == spec_b.name and spec_a.identity != spec_b.identity
    manager._claim(spec_a)
    with pytest.raises(SandboxError) as info:
        manager._claim(spec_b)
    assert info.value.code == "SANDBOX_UNAVAILABLE" and "differs" in info.value.message


def test_file_tools_protect_submodule_and_worktree_git_dirs(tmp_path: Path) -> None:
    """The default protected paths cover .git/modules/**/{hooks,config} and worktree configs."""
    fs = FsSection()
    for rel in (
        ".git/hooks/pre-commit",
        ".git/config",
        ".git/modules/sub/config",
        ".git/modules/sub/hooks/post-checkout",
        ".git/modules/a/modules/b/config",
        ".git/worktrees/wt/config.worktree",
    ):
        assert is_protected(fs.protected_paths, rel), rel
    for rel in ("src/config", ".git/modules/sub/HEAD", ".gitconfig", ".git/configx"):
        assert not is_protected(fs.protected_paths, rel), rel
    files = WorkspaceFiles([Root("/workspace", tmp_path, False, "ws")], fs, FileStates(tmp_path / "st.json"), tmp_path)
    with pytest.raises(SandboxError) as info:
        files.check_writable(files.locate(".git/modules/sub/config"))
    assert info.value.code == "PERMISSION_DENIED" and "protected path" in info.value.message


def test_protected_mounts_cover_existing_submodules_and_pin_parents(tmp_path: Path) -> None:
    """Literal paths always; globs as found; every parent between is pinned; objects/ is not walked."""
    (tmp_path / ".git/modules/sub/hooks").mkdir(parents=True)
    (tmp_path / ".git/modules/sub/config").write_text("[core]\n")
    (tmp_path / ".git/modules/sub/objects/hooks").mkdir(parents=True)
    mounts = {m.rel: m for m in protected_mounts(tmp_path, FsSection().protected_paths)}
    assert mounts[".git/hooks"].kind == "dir" and mounts[".git/config"].kind == "file"
    assert mounts[".git/modules/sub/hooks"].kind == "dir" and mounts[".git/modules/sub/config"].kind == "file"
    for pin in (".git", ".git/modules", ".git/modules/sub"):
        assert mounts[pin].kind == "keep" and not mounts[pin].read_only
    assert not any("objects" in rel for rel in mounts)


def test_protected_path_reached_through_a_link_refuses(tmp_path: Path) -> None:
    """A `.git/hooks` that is a link (e.g. to /etc) refuses the sandbox instead of mounting its target."""
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git/hooks").symlink_to("/etc")
    with pytest.raises(BindRefused) as info:
        protected_mounts(tmp_path, [".git/hooks"])
    assert info.value.rule == "protected-path-link"


def test_no_follow_create_refuses_a_planted_link(tmp_path: Path) -> None:
    """mkdir + chown through a link planted at the path (or a parent) is refused; the target is untouched."""
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "secret").write_text("s")
    before = victim.stat()
    root = tmp_path / "root"
    root.mkdir()
    (root / "scratch").symlink_to(victim)
    for parts in (["scratch"], ["scratch", "deeper"]):
        with pytest.raises(SandboxError) as info:
            ensure_dir(root, parts, owner=(1000, 1000), chown_existing=True)
        assert info.value.code == "PERMISSION_DENIED" and "symbolic link" in info.value.message
    with pytest.raises(SandboxError):
        ensure_file(root, ["scratch", "config"], owner=(1000, 1000))
    after = victim.stat()
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (before.st_uid, before.st_gid, 0o700)
    assert sorted(os.listdir(victim)) == ["secret"]


def test_no_follow_create_makes_and_chowns_real_dirs(tmp_path: Path) -> None:
    """A missing path is made component by component and the new dirs go to the owner."""
    owner = (os.getuid(), os.getgid()) if os.geteuid() != 0 else (1000, 1000)
    made = ensure_dir(tmp_path / "r", ["a", "b"], owner=owner, chown_existing=True)
    assert made == os.path.realpath(tmp_path / "r/a/b") and (os.stat(made).st_uid, os.stat(made).st_gid) == owner
    path, created = ensure_file(tmp_path / "r", ["a", "cfg"], owner=owner)
    assert created and os.path.getsize(path) == 0
    assert ensure_file(tmp_path / "r", ["a", "cfg"], owner=owner) == (path, False)


def test_scratch_path_with_a_planted_link_is_refused_by_the_bind_rules(tmp_path: Path) -> None:
    """A link at the scratch path makes the spec fail (rule scratch-link) before anything is made."""
    config = load_config_text(f"state_dir: {tmp_path}/s\n", base_dir=tmp_path)
    agent = effective_agent(config, "main")
    scratch = Path(spec_from_config(config, agent, "agent:main:x", "i").mounts[0].source)
    scratch.parent.mkdir(parents=True)
    (tmp_path / "victim").mkdir()
    scratch.symlink_to(tmp_path / "victim")
    with pytest.raises(BindRefused) as info:
        spec_from_config(config, agent, "agent:main:x", "i")
    assert info.value.rule == "scratch-link"


def test_workspace_inside_a_workspace_root_is_refused(tmp_path: Path) -> None:
    """A workspace inside a workspace_root would sit among scratch workspaces, in some tenant's
    folder (writing into its sessions and counting toward its disk quota): refused at load."""
    from sandbox.runtime.naming import tenant_dir_name

    text = (
        f"state_dir: {tmp_path}/s\ntenants: [{{id: acme}}, {{id: globex}}]\n"
        f"agents: {{list: [{{id: a, tenant: acme, sandbox: {{workspace_access: rw}}, "
        f"workspace: {tmp_path}/s/sandboxes/{tenant_dir_name('globex')}}}, {{id: g, tenant: globex}}]}}"
    )
    (found,) = problems(text, tmp_path)
    assert "agents.list[0].workspace" in found and f"lies inside the workspace_root {tmp_path}/s/sandboxes" in found


def test_exec_env_names_that_no_command_could_start_with_are_invalid_arguments() -> None:
    """An empty name, one holding `=` or NUL, a value holding NUL: refused with the name, before
    any sandbox is asked (the agent could only answer that the command did not start)."""
    from pydantic import ValidationError

    from sandbox.tools.builtin import ExecArgs

    for env in ({"": "x"}, {"A=B": "x"}, {"A\0": "x"}, {"A": "x\0y"}):
        with pytest.raises(ValidationError, match="environment name"):
            ExecArgs.model_validate({"command": "true", "env": env})
    assert ExecArgs.model_validate({"command": "true", "env": {"A_1": "x=y", "B": ""}}).env == {"A_1": "x=y", "B": ""}
