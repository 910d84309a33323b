"""Bind validation rules, each tried with a bad bind (pure: host paths only, no engine)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.config.binds import validate_binds
from sandbox.config.models import DockerConfig
from sandbox.errors import BindRefused

DEFAULT = DockerConfig()


def refused(bind: str, docker: DockerConfig = DEFAULT) -> BindRefused:
    with pytest.raises(BindRefused) as info:
        validate_binds([bind], docker)
    return info.value


@pytest.mark.parametrize(
    ("bind", "rule", "relation"),
    [
        ("/:/mnt/root", "system-path", "host root"),
        ("/etc:/mnt/etc", "system-path", "is the system path /etc"),
        ("/etc/ssl:/mnt/ssl", "system-path", "lies under the system path /etc"),
        ("/var:/mnt/var", "system-path", "is an ancestor of the system path /var/run"),
        (
            "/var/lib/docker/volumes:/mnt/v",
            "system-path",
            "lies under the system path /var/lib/docker",
        ),
        ("/proc:/mnt/p", "system-path", "/proc"),
        ("/sys/fs:/mnt/s", "system-path", "/sys"),
        ("/dev:/mnt/d", "system-path", "/dev"),
        ("/boot:/mnt/b", "system-path", "/boot"),
        ("/root:/mnt/r", "system-path", "/root"),
        ("/run/containerd:/mnt/c", "system-path", "/run"),
        ("/usr/lib:/mnt/u", "system-path", "/usr"),
        ("/lib:/mnt/l", "system-path", "/lib"),
        ("/var/lib/kubelet:/mnt/k", "system-path", "/var/lib/kubelet"),
        ("/home:/mnt/h", "credential-path", "is an ancestor of the credentials path"),
        ("relative/path:/mnt/x", "relative-source", "not an absolute path"),
        ("/srv/x:relative", "target-relative", "is not absolute"),
        ("/srv/x:/workspace", "target-shadows", "would shadow"),
        ("/srv/x:/workspace/sub", "target-shadows", "would shadow"),
        ("/srv/x:/etc/app", "target-shadows", "would shadow"),
        ("/srv/x:/", "target-shadows", "would shadow"),
        ("/srv/x:/usr", "target-shadows", "would shadow"),
        ("/srv/x:/mnt/x:rx", "bind-format", "expected ro or rw"),
        ("/srv/x", "bind-format", "is not `host:container"),
    ],
)
def test_blocked_binds(bind: str, rule: str, relation: str) -> None:
    """Each rule refuses its bind, naming the rule, the path and a fix."""
    error = refused(bind)
    assert error.rule == rule
    assert relation in error.message
    assert error.fix


def test_home_credentials_and_their_parents(tmp_path: Path) -> None:
    """~/.ssh, a subdir of it, and the home that contains it are all refused."""
    home = os.path.realpath(os.path.expanduser("~"))
    for bind, relation in (
        (f"{home}/.ssh:/mnt/s", "is the credentials path"),
        (f"{home}/.aws/config:/mnt/a", "lies under the credentials path"),
        (f"{home}:/mnt/home", "is an ancestor of the credentials path"),
        ("~/.kube:/mnt/k", "is the credentials path"),
    ):
        error = refused(bind)
        assert error.rule in ("credential-path", "system-path"), error
        assert relation in error.message or "system path /root" in error.message


def test_symlink_to_blocked_target_is_refused(tmp_path: Path) -> None:
    """A source that is a symlink to a blocked path is refused after resolving it."""
    link = tmp_path / "innocent"
    os.symlink("/etc", link)
    error = refused(f"{link}:/mnt/x")
    assert error.rule == "system-path" and "resolved from" in error.message and "/etc" in error.message


def test_symlinked_ancestor_into_blocked_path(tmp_path: Path) -> None:
    """A path whose parent is a symlink into a blocked path, and that does not exist yet, is refused."""
    link = tmp_path / "p"
    os.symlink("/var/lib", link)
    assert refused(f"{link}/docker/new:/mnt/x").rule == "system-path"


def test_socket_refused(tmp_path: Path) -> None:
    """A socket (by type or by *.sock name) is refused."""
    import socket

    path = tmp_path / "s"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        assert refused(f"{path}:/mnt/s").rule == "socket"
    finally:
        server.close()
    assert refused(f"{tmp_path}/docker.sock:/mnt/d.sock").rule == "socket"


def test_allowed_bind_roots(tmp_path: Path) -> None:
    """With allowed_bind_roots, sources must lie under one of them."""
    (tmp_path / "ok").mkdir()
    docker = DockerConfig(allowed_bind_roots=[tmp_path / "ok"])
    assert validate_binds([f"{tmp_path}/ok:/mnt/ok"], docker)[0].mode == "ro"
    assert refused(f"{tmp_path}/other:/mnt/o", docker).rule == "outside-allowed-roots"


def test_escape_hatches(tmp_path: Path) -> None:
    """dangerously_allow_* lifts exactly its own rule."""
    docker = DockerConfig(dangerously_allow_system_paths=True)
    assert validate_binds(["/etc:/mnt/etc"], docker)[0].source == "/etc"
    assert refused("/etc:/workspace", docker).rule == "target-shadows"
    assert refused(f"{tmp_path}/x.sock:/mnt/s", docker).rule == "socket"


def test_valid_binds_parse(tmp_path: Path) -> None:
    """Valid binds default to ro, keep rw, resolve symlinks and reject duplicate targets."""
    (tmp_path / "a").mkdir()
    os.symlink(tmp_path / "a", tmp_path / "alias")
    specs = validate_binds([f"{tmp_path}/alias:/mnt/a", f"{tmp_path}/a:/data/b:rw"], DEFAULT)
    assert [(s.source, s.target, s.mode) for s in specs] == [
        (str(tmp_path / "a"), "/mnt/a", "ro"),
        (str(tmp_path / "a"), "/data/b", "rw"),
    ]
    with pytest.raises(BindRefused, match="already mounted"):
        validate_binds([f"{tmp_path}/a:/mnt/a", f"{tmp_path}/a:/mnt/a/"], DEFAULT)


@pytest.mark.parametrize(
    ("bind", "rule"),
    [
        ("/tmp:/mnt/t", "socket-home"),
        ("/var/tmp:/mnt/t", "socket-home"),
        ("/tmp/.X11-unix:/mnt/x", "socket-home"),
        ("/tmp/tmux-1000:/mnt/x", "socket-home"),
        ("/dev/shm:/mnt/s", "system-path"),
        ("/run/user/1000:/mnt/r", "system-path"),
    ],
)
def test_socket_homes_refused(bind: str, rule: str) -> None:
    """/tmp, /var/tmp, their X11/tmux/ssh socket dirs, /dev/shm and /run/user are never bind sources."""
    assert refused(bind).rule == rule


def test_mount_holding_a_socket_is_refused_at_create(tmp_path: Path) -> None:
    """A socket deep in a workspace (a dev database's .s.PGSQL.5432) refuses the container's creation."""
    import socket

    from sandbox.config import effective_agent, load_config_text
    from sandbox.runtime.docker.create import create_kwargs
    from sandbox.runtime.spec import build_spec

    ws = tmp_path / "ws"
    (ws / "db" / "run").mkdir(parents=True)
    config = load_config_text(
        f"state_dir: {tmp_path}/state\nagents: {{list: [{{id: main, workspace: '{ws}', "
        "sandbox: {workspace_access: ro}}]}"
    )
    spec = build_spec(effective_agent(config, "main"), "agent:main:s", "inst")
    create_kwargs(spec)  # no socket yet: fine
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(ws / "db" / "run" / ".s.PGSQL.5432"))
    try:
        with pytest.raises(BindRefused) as info:
            create_kwargs(spec)
    finally:
        server.close()
    assert info.value.rule == "contains-socket" and info.value.path.endswith("db/run/.s.PGSQL.5432")


def test_socket_scan_is_bounded(tmp_path: Path) -> None:
    """The scan stops at its entry budget and says it saw only part of the tree."""
    from sandbox.config.binds import find_sockets

    for i in range(50):
        (tmp_path / f"f{i}").write_text("")
    assert find_sockets([str(tmp_path)], max_entries=10).complete is False
    assert find_sockets([str(tmp_path)]).complete is True
