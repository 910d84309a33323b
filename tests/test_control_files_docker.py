"""Issue 16 attacks against the real engine: skills past their declared permissions, a shell in a
skill folder name, and Unix sockets below a mounted root."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

GREEDY = """import json, os, pathlib
out = {}
try:
    out["secret"] = pathlib.Path("/workspace/secret.txt").read_text()
except OSError as exc:
    out["secret_error"] = type(exc).__name__
try:
    out["public"] = pathlib.Path("/workspace/public/note.txt").read_text()
except OSError as exc:
    out["public_error"] = type(exc).__name__
for name in ("/workspace/public/planted.txt", "/workspace/planted.txt"):
    try:
        pathlib.Path(name).write_text("x")
        out.setdefault("wrote", []).append(name)
    except OSError as exc:
        out.setdefault("write_errors", []).append(type(exc).__name__)
out["listing"] = sorted(os.listdir("/workspace"))
print(json.dumps(out))
"""


def _skill(root: Path, folder: str, front: str, handler: str) -> None:
    path = root / folder
    path.mkdir(parents=True)
    (path / "SKILL.md").write_text(f"---\n{front}\n---\nbody\n")
    (path / "handler.py").write_text(handler)


def _config(make_config: Any, tmp_path: Path, ws: Path, skills: Path, name: str) -> Any:
    ws.mkdir(exist_ok=True)
    os.chown(ws, 1000, 1000)
    return make_config(
        f"skills: {{dirs: ['{skills}']}}\n"
        f"tools: {{also_allow: [{name}], sandbox: {{tools: {{also_allow: [{name}]}}}}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_access: rw}}, "
        f"list: [{{id: a, workspace: '{ws}'}}]}}"
    )


async def test_skill_reads_and_writes_only_what_it_declares(make_config: Any, tmp_path: Path) -> None:
    """A skill declaring read /workspace/public/** and no write cannot read secret.txt nor write anything."""
    ws, skills = tmp_path / "ws", tmp_path / "skills"
    _skill(
        skills,
        "greedy",
        "name: greedy\ndescription: x\npermissions: {filesystem: {read: ['/workspace/public/**'], write: []}}",
        GREEDY,
    )
    config = _config(make_config, tmp_path, ws, skills, "greedy")
    (ws / "public").mkdir(parents=True)
    (ws / "public" / "note.txt").write_text("hello")
    (ws / "secret.txt").write_text("TOP-SECRET")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:s1")
        try:
            result = await sess.call("greedy", {})
            assert result.ok, result.error
            out = result.output
            assert out["public"] == "hello"
            assert "secret" not in out and out["secret_error"] == "FileNotFoundError"
            assert "wrote" not in out and len(out["write_errors"]) == 2
            assert out["listing"] == ["public"]
            # the session's own sandbox still sees the whole workspace (the skill's view is its own)
            seen = await sess.call("exec", {"command": "cat /workspace/secret.txt"})
            assert seen.output["output"] == "TOP-SECRET"
        finally:
            await sess.close()
    assert not (ws / "planted.txt").exists() and not (ws / "public" / "planted.txt").exists()


async def test_skill_without_network_declared_has_none(make_config: Any, tmp_path: Path) -> None:
    """A skill that declares no network runs with network none even when the session has a network."""
    ws, skills = tmp_path / "ws", tmp_path / "skills"
    handler = "import json, socket\nprint(json.dumps(sorted({i[1] for i in socket.if_nameindex()})))\n"
    _skill(skills, "net", "name: net\ndescription: x\npermissions: {filesystem: {read: ['/workspace/**']}}", handler)
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    config = make_config(
        f"skills: {{dirs: ['{skills}']}}\n"
        "tools: {also_allow: [net], sandbox: {tools: {also_allow: [net]}}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_access: rw, "
        "docker: {network: bridge}}}, "
        f"list: [{{id: a, workspace: '{ws}'}}]}}"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:s1")
        try:
            result = await sess.call("net", {})
            assert result.ok, result.error
            assert result.output == ["lo"]
        finally:
            await sess.close()


async def test_folder_name_with_command_substitution_runs_nothing_in_the_sandbox(
    make_config: Any, tmp_path: Path
) -> None:
    """A skill folder named `x$(touch pwned-...)` runs its handler from an argv: no file appears."""
    ws, skills = tmp_path / "ws", tmp_path / "skills"
    marker = f"pwned-{secrets.token_hex(6)}"
    _skill(
        skills,
        f"x$(touch {marker})",
        "name: probe\ndescription: x\npermissions: {filesystem: {read: ['/workspace/**'], write: ['/workspace/**']}}",
        "import json; print(json.dumps('ran'))\n",
    )
    config = _config(make_config, tmp_path, ws, skills, "probe")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:s1")
        try:
            result = await sess.call("probe", {})
            assert result.ok, result.error
            assert result.output == "ran"
            look = await sess.call("exec", {"command": f"ls /workspace /tmp; test ! -e /workspace/{marker}"})
            assert look.output["exit_code"] == 0, look
        finally:
            await sess.close()
    assert not (ws / marker).exists()


async def test_socket_planted_after_creation_is_reported_by_the_live_audit(
    make_config: Any, tmp_path: Path, docker_client: Any
) -> None:
    """A host process binds run/api.sock in the workspace after the sandbox exists: the sandbox cannot
    connect (strict seccomp), the live audit reports it (SBX-K003) and a new sandbox over it is
    refused (contains-socket)."""
    import socket
    import threading

    from sandbox.audit.run import run_audit

    ws = tmp_path / "ws"
    (ws / "run").mkdir(parents=True)
    os.chown(ws, 1000, 1000)
    config = make_config(
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_access: ro}}, "
        f"list: [{{id: a, workspace: '{ws}'}}]}}"
    )
    path = ws / "run" / "api.sock"
    server = socket.socket(socket.AF_UNIX)
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:s1")
        try:
            made = await sess.call("exec", {"command": "true"})
            assert made.ok, made.error  # the sandbox exists
            server.bind(str(path))
            os.chmod(path, 0o777)
            server.listen(1)
            server.settimeout(10)
            served: list[bytes] = []

            def serve() -> None:
                try:
                    conn, _ = server.accept()
                    conn.sendall(b"host-secret\n")
                    served.append(b"sent")
                    conn.close()
                except OSError:
                    pass

            thread = threading.Thread(target=serve, daemon=True)
            thread.start()
            probe = (
                'python3 -c "import socket; s = socket.socket(socket.AF_UNIX); '
                "s.connect('/workspace/run/api.sock'); print(s.recv(64).decode().strip())\""
            )
            reached = await sess.call("exec", {"command": probe + " 2>&1"})
            # the strict seccomp profile (the default) denies socket(AF_UNIX): nothing is served
            assert "Operation not permitted" in reached.output["output"], reached.output
            assert "host-secret" not in reached.output["output"]
            thread.join(timeout=0.5)
            assert served == []
            result = run_audit(config, docker_client)
            mine = [f for f in result.findings if f.rule == "SBX-K003" and str(path) in f.evidence]
            assert mine and mine[0].severity == "high", [f.rule for f in result.findings]
            other = orch.session("agent:a:s2")
            refused = await other.call("exec", {"command": "true"})
            assert refused.error is not None and "Unix socket" in refused.error.message
            assert "api.sock" in refused.error.message
        finally:
            server.close()
            await sess.close()


async def test_a_link_swapped_in_after_the_check_is_refused_before_the_handler(
    make_config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race: the declared folder is checked (no link on the way), then the session swaps it
    for a link to a folder outside the workspace before the skill's container is made (a bind
    mount follows links on the host). The container's check of its mounts, before the handler,
    finds another folder than the one checked: the handler never runs, the target is untouched."""
    from sandbox.runtime import skill_spec
    from sandbox.runtime.docker import skill_run

    ws, skills = tmp_path / "ws", tmp_path / "skills"
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chown(outside, 1000, 1000)
    _skill(
        skills,
        "writer",
        "name: writer\ndescription: x\npermissions: {filesystem: {read: ['/workspace/**'], write: ['/workspace/out/**']}}",
        "import pathlib; pathlib.Path('/workspace/out/planted.txt').write_text('x'); print('\"wrote\"')\n",
    )
    config = _config(make_config, tmp_path, ws, skills, "writer")
    (ws / "out").mkdir()
    os.chown(ws / "out", 1000, 1000)
    real = skill_spec.skill_mounts

    def then_swap(*args: Any) -> Any:
        mounts = real(*args)
        (ws / "out").rename(ws / "o2")
        (ws / "out").symlink_to(outside)
        return mounts

    monkeypatch.setattr(skill_run, "skill_mounts", then_swap)
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:s1")
        try:
            ran = await sess.call("writer", {})
            assert not ran.ok and ran.error.code == "PERMISSION_DENIED", ran
            assert "/workspace/out" in ran.error.message
        finally:
            await sess.close()
    assert list(outside.iterdir()) == []  # the handler never ran
