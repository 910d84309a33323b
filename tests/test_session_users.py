"""Session users as pure logic: when they apply, how uids are allocated, what the scripts get."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.config import effective_agent, load_config_text
from sandbox.errors import SandboxError
from sandbox.runtime import session_users, shellwrap
from sandbox.runtime.protocol import ExecResult, RunRequest
from sandbox.runtime.session_users import UID_BASE, UID_SPAN, SessionUser, allocate, uses_session_users
from sandbox.runtime.spec import SandboxSpec, build_spec
from sandbox.testing import FakeBackend, FakeSandbox


@pytest.mark.parametrize(
    ("setting", "scope", "access", "user", "expected"),
    [
        ("auto", "agent", "none", "1000:1000", True),
        ("auto", "shared", "ro", "1000:1000", True),
        ("auto", "session", "none", "1000:1000", False),  # one session per container: nothing to split
        ("auto", "agent", "rw", "1000:1000", False),  # the user's own folder: files would get odd owners
        ("on", "agent", "rw", "1000:1000", True),
        ("off", "agent", "none", "1000:1000", False),
        ("on", "agent", "none", "sandbox", False),  # no numeric group to share
    ],
)
def test_when_sessions_get_users(setting: str, scope: str, access: str, user: str, expected: bool) -> None:
    """auto means: shared container, workspace not the user's writable folder, numeric user."""
    assert uses_session_users(setting, scope, access, user) is expected


@pytest.mark.parametrize(("text", "value"), [("on", "on"), ("off", "off"), ("'off'", "off"), ("auto", "auto")])
def test_yaml_on_off_are_accepted(tmp_path: Path, text: str, value: str) -> None:
    """A bare YAML on/off (read as a boolean) means the same as the quoted word."""
    cfg = load_config_text(f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{session_users: {text}}}}}}}\n")
    assert cfg.agents.defaults.sandbox.session_users == value


def test_allocation_is_stable_and_distinct(tmp_path: Path) -> None:
    """A session gets the same uid and directory every time; two sessions never share one."""
    a1, b = allocate(tmp_path, "agent:main:a", 1000), allocate(tmp_path, "agent:main:b", 1000)
    a2 = allocate(tmp_path, "agent:main:a", 1000)
    assert a1 == a2 and a1.uid != b.uid and a1.pid_dir("c1") != b.pid_dir("c1")
    assert a1.user == f"{a1.uid}:1000" and UID_BASE <= a1.uid < UID_BASE + UID_SPAN
    assert a1.pid_dir("c1").startswith(f"/tmp/.sbx-{a1.uid}-") and shellwrap.is_private(a1.pid_dir("c1"))
    # a recreated container gets a new, unguessable name (a squat of the old one is useless)
    assert a1.pid_dir("c2") != a1.pid_dir("c1") and a1.token not in a1.pid_dir("c1")


@given(st.lists(st.text(min_size=1, max_size=30), min_size=2, max_size=40, unique=True))
def test_many_sessions_get_distinct_uids(sessions: list[str]) -> None:
    """Whatever the keys (colliding hashes included), every session gets its own uid."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        uids = [allocate(Path(tmp), s, 1000).uid for s in sessions]
    assert len(set(uids)) == len(sessions)


def test_concurrent_claims_hand_one_uid_to_one_session(tmp_path: Path) -> None:
    """Threads racing for the same session agree on one uid; racing sessions get different ones."""
    results: list[int] = []

    def claim(session: str) -> None:
        results.append(allocate(tmp_path, session, 1000).uid)

    threads = [threading.Thread(target=claim, args=(f"s{i % 4}",)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_session = {f"s{i}": allocate(tmp_path, f"s{i}", 1000).uid for i in range(4)}
    assert set(results) == set(by_session.values()) and len(set(by_session.values())) == 4


def test_a_full_neighbourhood_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When every probe is taken, the error says what to do instead of reusing a uid."""
    monkeypatch.setattr(session_users, "MAX_PROBES", 3)
    monkeypatch.setattr(session_users, "UID_SPAN", 3)
    for i in range(3):
        allocate(tmp_path, f"s{i}", 1000)
    with pytest.raises(SandboxError) as err:
        allocate(tmp_path, "one-too-many", 1000)
    assert err.value.code == "SANDBOX_UNAVAILABLE" and "scope: session" in err.value.message


def test_scripts_are_told_whether_their_directory_is_private() -> None:
    """The shared /tmp/.sbx keeps mode 1777; a session's own directory is 700 and ownership-checked."""
    shared = shellwrap.wrapped_argv("true", "c1")
    private = shellwrap.wrapped_argv("true", "c1", "/tmp/.sbx-20001-ab")
    assert shared[-1] == "1777" and private[-1] == "700"
    assert shellwrap.start_background_argv("x", "p1", "/tmp/.sbx-20001-ab")[-2:] == ["1", "fifo"]
    assert shellwrap.start_background_argv("x", "p1", stdin=False)[-2:] == ["0", "null"]  # a durable exec's
    assert shellwrap.poll_argv("p1", 0, 10, "/tmp/.sbx-20001-ab")[-1] == "1"
    assert shellwrap.write_stdin_argv("p1", "hi", "/tmp/.sbx-20001-ab")[7] == "1"
    assert shellwrap.kill_argv("p1", "KILL", "/tmp/.sbx-20001-ab")[-1] == "1"
    assert shellwrap.kill_argv("p1", "KILL")[-1] == "0"


class RecordingSandbox(FakeSandbox):
    """A fake sandbox that keeps each RunRequest it is given, whole."""

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(FakeBackend(), spec)
        self.requests: list[RunRequest] = []

    async def run(self, request: RunRequest) -> ExecResult:
        self.requests.append(request)
        return await super().run(request)


@pytest.mark.anyio
async def test_a_session_shell_fills_in_only_what_it_owns(tmp_path: Path) -> None:
    """A session's shell sets its uid, its record directory and the shared-workspace env on the
    request; a caller's own user and pid_dir win, and every other field passes unchanged."""
    config = load_config_text(f"state_dir: {tmp_path}\n")
    sandbox = RecordingSandbox(build_spec(effective_agent(config, "main"), "agent:main:s", "inst1"))
    shell = session_users.SessionShell(sandbox, SessionUser(20001, 1000, "tok"))
    chunks: list[bytes] = []
    asked = RunRequest(
        "echo hi",
        call_id="c1",
        env={"A": "1", "SBX_UMASK": "077"},
        workdir="/workspace/sub",
        timeout_s=5,
        on_output=chunks.append,
    )
    await shell.run(asked)
    await shell.run(dataclasses.replace(asked, user="0", pid_dir="/tmp/.sbx-mine"))
    default, own = sandbox.requests
    assert default.user == "20001:1000" and default.pid_dir == shell.pid_dir and shellwrap.is_private(default.pid_dir)
    assert default.env == {**session_users.SESSION_ENV, "A": "1", "SBX_UMASK": "077"}  # the caller's env wins
    assert dataclasses.replace(default, env=asked.env, user=None, pid_dir=None) == asked
    assert own.user == "0" and own.pid_dir == "/tmp/.sbx-mine"


def test_a_session_never_gets_the_sandbox_s_own_uid_and_is_found_without_a_claim(tmp_path: Path) -> None:
    """The uid a session's search would take first is skipped when it is the sandbox's own user
    (whose processes are the container's keep-alive and every session-less command); `find`
    answers the same uid later and claims nothing for a session that never got one."""
    su = session_users
    session = "agent:main:first-probe"
    first = su.UID_BASE + su._first_probe(session) % su.UID_SPAN
    assert su.allocate(tmp_path / "plain", session, 1000).uid == first
    avoided = su.allocate(tmp_path / "avoid", session, 1000, avoid=first)
    assert avoided.uid != first
    assert su.find(tmp_path / "avoid", session, 1000, avoid=first) == avoided
    before = sorted(p.name for p in (tmp_path / "avoid").iterdir())
    assert su.find(tmp_path / "avoid", "agent:main:never", 1000, avoid=first) is None
    assert sorted(p.name for p in (tmp_path / "avoid").iterdir()) == before
