"""A full disk under the state dir refuses calls with a retryable code (SERVICE_UNAVAILABLE), not
INTERNAL, and corrupts nothing: once space is freed the same calls succeed, the journal passes
SQLite's integrity check with every earlier event, and the instance id and token file are as they
were. The disk is real: a 2 MiB tmpfs mounted as the state dir (root only), filled to the last block.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sandbox import Orchestrator, load_config_text
from sandbox.errors import ErrorCode, SandboxError
from sandbox.runtime.naming import instance_id
from tests.cli_helpers import run_cli
from tests.service_helpers import TOKEN_A, serve, sha

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

A = {"Authorization": f"Bearer {TOKEN_A}"}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs at tmp_path/state, unmounted at the end."""
    state = tmp_path / "state"
    state.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(state)], check=False)
    if mounted.returncode != 0:
        pytest.skip("this machine cannot mount a tmpfs")
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk says ENOSPC; returns it (remove it to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def config(tmp_path: Path, state: Path) -> Any:
    return load_config_text(f"""
state_dir: {state}
tools: {{profile: full}}
tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list: [{{id: alpha, tenant: acme, default: true, workspace: "{tmp_path / "wa"}"}}]
""")


def intact_journal(state: Path) -> list[str]:
    """SQLite's integrity check of the journal ("ok") and the stages it holds, in order."""
    db = sqlite3.connect(state / "journal.sqlite3")
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return [row[0] for row in db.execute("SELECT stage FROM events ORDER BY id")]
    finally:
        db.close()


CALLS = [
    ("exec", {"command": "echo hi"}),
    ("read", {"path": "missing.txt"}),
    ("write", {"path": "w.txt", "content": "x"}),
]


def test_a_full_disk_makes_calls_retryable_and_corrupts_nothing(tmp_path: Path, small_disk: Path) -> None:
    """Library calls on a full state-dir disk come back SERVICE_UNAVAILABLE, retryable, saying the
    disk is full (they were INTERNAL, not retryable); freed, the same calls succeed and nothing kept
    before is lost or damaged."""
    cfg = config(tmp_path, small_disk)
    instance = instance_id(small_disk, None)

    async def main() -> tuple[list[Any], list[Any]]:
        async with Orchestrator(cfg) as orch:
            session = orch.session("agent:alpha:s")
            assert (await session.call("exec", {"command": "echo before"})).ok
            filler = fill(small_disk)
            full = [await session.call(tool, args) for tool, args in CALLS]
            filler.unlink()
            freed = [await session.call(tool, args) for tool, args in CALLS]
            return full, freed

    full, freed = anyio.run(main)
    for result in full:
        assert not result.ok and result.error is not None, result
        assert result.error.code == "SERVICE_UNAVAILABLE" and result.error.retryable, result.error
        assert "disk is full" in result.error.message
        assert str(small_disk) not in result.error.message  # no host path reaches a tenant
    assert [r.ok for r in freed] == [True, False, True]
    assert freed[1].error is not None and freed[1].error.code == "FILE_NOT_FOUND"
    stages = intact_journal(small_disk)
    assert stages.count("finished") == 3 and stages[0] == "proposed"  # the call before and the two freed
    assert instance_id(small_disk, None) == instance


@pytest.mark.slow
def test_the_service_answers_a_full_disk_with_a_retryable_code(tmp_path: Path, small_disk: Path) -> None:
    """Through the real service: on a full disk a call is SERVICE_UNAVAILABLE and retryable, a new
    token cannot be made (SERVICE_UNAVAILABLE, the token file unchanged, no temporary file left);
    freed, calls and the stored token work again and the journal is intact."""
    cfg = config(tmp_path, small_disk)
    from sandbox.api.tenants import create_token

    stored = create_token(cfg, "acme", "laptop")
    tokens = small_disk / "tenant-tokens.json"
    before = tokens.read_bytes()
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        f"state_dir: {small_disk}\ntenants: [{{id: acme}}]\nagents: {{list: [{{id: alpha, tenant: acme}}]}}\n"
    )
    call = {"tool": "write", "args": {"path": "f.txt", "content": "x"}}
    with serve(cfg) as url:
        assert httpx.post(f"{url}/v1/sessions/s1/calls", headers=A, json=call).json()["ok"]
        filler = fill(small_disk)
        r = httpx.post(f"{url}/v1/sessions/s1/calls", headers=A, json=call)
        assert r.status_code == 200, r.text
        error = r.json()["error"]
        assert error["code"] == "SERVICE_UNAVAILABLE" and error["retryable"] is True, error
        made = run_cli("--config", str(cfg_file), "tenants", "token", "create", "acme", "--name", "more")
        assert made.returncode == 1 and "error [SERVICE_UNAVAILABLE]" in made.stderr, made.stderr
        assert tokens.read_bytes() == before
        assert [p.name for p in small_disk.iterdir() if p.name.startswith(".tenant-tokens.json")] == []
        filler.unlink()
        r = httpx.post(f"{url}/v1/sessions/s1/calls", headers=A, json=call)
        assert r.json()["ok"], r.text
        again = httpx.post(f"{url}/v1/sessions/s1/calls", headers={"Authorization": f"Bearer {stored}"}, json=call)
        assert again.status_code == 200 and again.json()["ok"], again.text
    assert json.loads(tokens.read_bytes()) == json.loads(before)
    assert intact_journal(small_disk).count("finished") == 3


def test_an_instance_id_that_cannot_be_written_leaves_no_half_file(small_disk: Path) -> None:
    """Making the instance id on a full disk is SERVICE_UNAVAILABLE and leaves no file (an empty
    one would read as damaged at the next start); once space is freed the id is made."""
    filler = fill(small_disk)
    with pytest.raises(SandboxError) as info:
        instance_id(small_disk, None)
    assert info.value.code == ErrorCode.SERVICE_UNAVAILABLE and info.value.retryable
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
    filler.unlink()
    made = instance_id(small_disk, None)
    assert (small_disk / "instance-id").read_text() == made + "\n"
