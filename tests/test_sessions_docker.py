"""Spawned sessions against the real engine: a child's own sandbox with its parent's workspace
read-only at /parent, and the cascade when the parent closes, including an orchestrator killed
with SIGKILL half-way through it and the restart that finishes it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator, load_config
from tests.cli_helpers import run_cli

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

PARENT = "agent:main:work"


def config_text(tmp_path: Path, instance: str, extra: str = "") -> str:
    return (
        f"state_dir: {tmp_path / 'state'}\ninstance: {instance}\n"
        f"tools: {{subagents: {{max_children: 5, {extra}}}}}\n"
        "agents: {defaults: {sandbox: {mode: all}}}\n"
    )


def make(tmp_path: Path, instance: str, extra: str = "") -> Any:
    path = tmp_path / "sandbox.yaml"
    path.write_text(config_text(tmp_path, instance, extra))
    return load_config(path)


async def test_child_runs_in_its_own_sandbox_and_sees_the_parent_read_only(tmp_path: Path, instance: str) -> None:
    """The child's container and workspace are its own; /parent is the parent's workspace, read-only."""
    async with Orchestrator(make(tmp_path, instance)) as orch:
        parent = orch.session(PARENT)
        wrote = await parent.call("write", {"path": "notes.txt", "content": "hello from parent\n"})
        assert wrote.ok, wrote
        spawned = await parent.call("sessions_spawn", {"task": "read the notes", "name": "reader"})
        assert spawned.ok and spawned.output["parent_workspace"] == "/parent (ro)", spawned
        child = orch.session(spawned.output["session"])
        try:
            r = await child.call(
                "exec",
                {
                    "command": "cat /parent/notes.txt; (echo x > /parent/new.txt) 2>&1 | tail -1; "
                    "ls -A /workspace | grep -c notes.txt; echo done"
                },
            )
            out = r.output["output"]
            assert r.ok and "hello from parent" in out and "Read-only file system" in out, out
            assert out.split("\n")[-3] == "0"  # the child's own /workspace does not hold the parent's file
            parent_box, child_box = await parent.sandbox(), await child.sandbox()
            assert parent_box.spec.name != child_box.spec.name and child_box.spec.scope == "session"
            listed = await parent.call("exec", {"command": "ls -A /workspace"})
            assert "new.txt" not in listed.output["output"]
            # explain shows the child as it runs: its own container, the parent's workspace at /parent
            shown = json.loads(
                run_cli("--config", str(tmp_path / "sandbox.yaml"), "explain", "--session", child.key, "--json").stdout
            )["container"]
            assert shown["name"] == child_box.spec.name
            assert {"container": "/parent", "mode": "ro"}.items() <= next(
                m for m in shown["mounts"] if m["container"] == "/parent"
            ).items()
        finally:
            await parent.close()


async def test_parent_view_none_mounts_nothing(tmp_path: Path, instance: str) -> None:
    """tools.subagents.parent_workspace: none gives the child no /parent at all."""
    async with Orchestrator(make(tmp_path, instance, "parent_workspace: none")) as orch:
        parent = orch.session(PARENT)
        spawned = await parent.call("sessions_spawn", {"task": "alone", "name": "alone"})
        child = orch.session(spawned.output["session"])
        try:
            r = await child.call("exec", {"command": "test -e /parent && echo present || echo absent"})
            assert r.output["output"].strip() == "absent", r
        finally:
            await parent.close()


async def test_closing_the_parent_removes_the_childs_sandbox(tmp_path: Path, instance: str) -> None:
    """The cascade removes the child's container (its background process with it) and refuses its calls."""
    async with Orchestrator(make(tmp_path, instance)) as orch:
        parent = orch.session(PARENT)
        key = (await parent.call("sessions_spawn", {"task": "wait", "name": "waiter"})).output["session"]
        child = orch.session(key)
        bg = await child.call("exec", {"command": "sleep 300", "background": True})
        assert bg.ok, bg
        name = (await child.sandbox()).spec.name
        assert await orch.backend.exists(name)
        closed = await parent.close()
        assert closed == [key, PARENT]
        assert not await orch.backend.exists(name)
        late = await orch.session(key).call("exec", {"command": "true"})
        assert late.error is not None and late.error.code == "CONFLICT", late


async def test_sigkill_half_way_through_a_cascade_is_finished_on_restart(tmp_path: Path, instance: str) -> None:
    """`sandbox sessions close` is killed with SIGKILL mid-cascade; `sandbox sessions recover` finishes it."""
    cfg_path = tmp_path / "sandbox.yaml"
    cfg_path.write_text(config_text(tmp_path, instance))
    keys, names = [], []
    async with Orchestrator(load_config(cfg_path)) as orch:
        parent = orch.session(PARENT)
        for i in range(3):
            key = (await parent.call("sessions_spawn", {"task": f"job {i}", "name": f"job{i}"})).output["session"]
            child = orch.session(key)
            assert (await child.call("exec", {"command": "sleep 300", "background": True})).ok
            keys.append(key)
            names.append((await child.sandbox()).spec.name)
    cli = [sys.executable, "-m", "sandbox", "--config", str(cfg_path)]
    closing = subprocess.Popen([*cli, "sessions", "close", PARENT], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    db = tmp_path / "state" / "sessions.sqlite3"
    deadline = time.monotonic() + 60
    began = False
    while time.monotonic() < deadline and closing.poll() is None:
        with sqlite3.connect(db) as conn:
            began = conn.execute("SELECT COUNT(*) FROM cascades").fetchone()[0] > 0
        if began:
            os.kill(closing.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    _, err = closing.communicate(timeout=30)
    assert began and closing.returncode == -signal.SIGKILL, err
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM cascades").fetchone()[0] == 1  # died half-way

    recovered = subprocess.run([*cli, "sessions", "recover", "--json"], capture_output=True, text=True, timeout=120)
    assert recovered.returncode == 0, recovered.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM cascades").fetchone()[0] == 0
        statuses = dict(conn.execute("SELECT key, status FROM lineage").fetchall())
    assert statuses == {k: "closed" for k in keys}
    async with Orchestrator(load_config(cfg_path)) as orch:
        for name in names:
            assert not await orch.backend.exists(name), name
