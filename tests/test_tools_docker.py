"""The sandboxed tools against real sandboxes, and every escape we know tried as an attack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from tests.call_helpers import writes_during_a_swap_race

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


@pytest.fixture(params=["runc", "runsc"])
def make_config(request: pytest.FixtureRequest, make_config: Any, docker_client: Any) -> Any:
    """The tool suite runs on each container runtime: runc, and gVisor's runsc (where the engine
    has it registered; `.ci/run` installs it, see README)."""
    import yaml

    runtime = request.param
    if runtime == "runsc" and "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("the engine has no runsc runtime (scripts/runsc installs and registers it)")

    def make(text: str = "{}", **kwargs: Any) -> Any:
        data = yaml.safe_load(text) or {}
        if runtime == "runsc":
            sandbox = data.setdefault("agents", {}).setdefault("defaults", {}).setdefault("sandbox", {})
            sandbox.setdefault("docker", {})["runtime"] = "runsc"
        return make_config(yaml.safe_dump(data), **kwargs)

    return make


def sandbox_config(make_config: Any, ws: Path, access: str = "rw", scope: str = "session", extra: str = "") -> Any:
    ws.mkdir(exist_ok=True)
    os.chown(ws, 1000, 1000)
    return make_config(f"""
tools: {{fs: {{workspace_only: true}}}}
agents:
  defaults: {{sandbox: {{mode: all, scope: {scope}, workspace_access: {access}{extra}}}}}
  list: [{{id: a, workspace: "{ws}"}}]
""")


@pytest.fixture
def decoy(tmp_path: Path) -> Path:
    """A directory outside every workspace holding a decoy file (never a real system file)."""
    path = tmp_path / "decoy"
    path.mkdir()
    (path / "decoy.txt").write_text("DECOY\n")
    os.chmod(path, 0o777)
    return path


def decoy_state(decoy: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in decoy.iterdir()}


ATTACKS: list[tuple[str, Callable[[str], dict[str, str]]]] = [
    ("read", lambda link: {"path": f"{link}"}),
    ("write", lambda link: {"path": f"{link}/x.txt", "content": "PWNED"}),
    ("write", lambda link: {"path": f"{link}/decoy.txt", "content": "PWNED"}),
    (
        "edit",
        lambda link: {"path": f"{link}/decoy.txt", "old_string": "DECOY", "new_string": "PWNED"},
    ),
    ("edit", lambda link: {"path": f"{link}", "old_string": "DECOY", "new_string": "PWNED"}),
    (
        "apply_patch",
        lambda link: {
            "input": f"*** Begin Patch\n*** Update File: {link}/decoy.txt\n@@\n-DECOY\n+PWNED\n*** End Patch\n"
        },
    ),
    (
        "apply_patch",
        lambda link: {"input": f"*** Begin Patch\n*** Add File: {link}/new.txt\n+PWNED\n*** End Patch\n"},
    ),
    (
        "apply_patch",
        lambda link: {"input": f"*** Begin Patch\n*** Delete File: {link}/decoy.txt\n*** End Patch\n"},
    ),
    ("read", lambda link: {"path": f"{link}/decoy.txt"}),
]


async def test_symlinks_planted_inside_never_lead_outside(make_config: Any, tmp_path: Path, decoy: Path) -> None:
    """Links planted by the sandbox (file, dir, `/`, parent dir, other session's ws) are never followed."""
    # workspace none + session scope: each session has its own scratch workspace
    config = sandbox_config(make_config, tmp_path / "ws", access="none")
    async with Orchestrator(config) as orch:
        victim = orch.session("agent:a:victim")
        other = orch.session("agent:a:other")
        await other.call("write", {"path": "mine.txt", "content": "OTHER SESSION\n"})
        other_ws = Path((await other.sandbox()).spec.workspace.source)
        assert other_ws != Path((await victim.sandbox()).spec.workspace.source)
        plant = (
            f"ln -s {decoy}/decoy.txt flink && ln -s {decoy} dlink && ln -s / d && "
            f"mkdir -p real && ln -s {decoy} real/parent && ln -s {other_ws} otherws && echo planted"
        )
        result = await victim.call("exec", {"command": plant})
        assert "planted" in result.output["output"], result
        before = decoy_state(decoy)
        attempts = 0
        for link in ("flink", "dlink", "d", "real/parent", "d/etc", "otherws"):
            for tool, make in ATTACKS:
                args = make(link)
                r = await victim.call(tool, args)
                attempts += 1
                assert not r.ok, (tool, args, r.output)
                assert r.error.code in (
                    "PERMISSION_DENIED",
                    "FILE_NOT_FOUND",
                    "INVALID_ARGUMENTS",
                ), (tool, args, r.error)
        assert attempts == 54
        assert decoy_state(decoy) == before
        assert (other_ws / "mine.txt").read_text() == "OTHER SESSION\n"


async def test_symlink_swap_race_never_lands_outside(make_config: Any, tmp_path: Path, decoy: Path) -> None:
    """A loop inside swaps a directory for a symlink while the host writes into it: nothing lands outside."""
    config = sandbox_config(make_config, tmp_path / "ws")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:race")
        swaps, outcomes = await writes_during_a_swap_race(sess, str(decoy))
        assert swaps > 10 and sum(outcomes.values()) >= 60, (swaps, outcomes)  # the race really ran
        assert set(decoy_state(decoy)) == {"decoy.txt"}, outcomes
        assert outcomes.get("PERMISSION_DENIED", 0) > 0 or outcomes.get("ok", 0) > 0


@pytest.mark.parametrize(
    "path",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "/workspace/../etc/shadow",
        "a\x00b",
        "x" * 5000,
        "\uff0e\uff0e/etc/passwd",
    ],
)
async def test_traversal_refused(make_config: Any, tmp_path: Path, path: str) -> None:
    """Traversal, absolute paths, NUL, long paths and look-alikes are refused by every file tool."""
    config = sandbox_config(make_config, tmp_path / "ws")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:trav")
        for tool, args in (("read", {"path": path}), ("write", {"path": path, "content": "x"})):
            r = await sess.call(tool, args)
            assert r.error.code in ("INVALID_ARGUMENTS", "PERMISSION_DENIED"), (tool, r.error)


async def test_read_only_workspace_and_bind_refuse_every_writer(make_config: Any, tmp_path: Path) -> None:
    """On a ro workspace and a ro bind, write, edit and apply_patch are refused; nothing changes."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    data.mkdir()
    (ws / "f.txt").write_text("orig\n")
    (data / "g.txt").write_text("bound\n")
    config = make_config(f"""
tools: {{fs: {{workspace_only: false}}}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session, workspace_access: ro, docker: {{binds: ['{data}:/mnt/data:ro']}}}}}}
  list: [{{id: a, workspace: "{ws}"}}]
""")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:ro")
        assert (await sess.call("read", {"path": "/mnt/data/g.txt"})).output["content"] == "bound\n"
        for target, name in (("f.txt", "the workspace"), ("/mnt/data/g.txt", "the bind /mnt/data")):
            for tool, args in (
                ("write", {"path": target, "content": "changed"}),
                ("edit", {"path": target, "old_string": "o", "new_string": "X"}),
                (
                    "apply_patch",
                    {"input": f"*** Begin Patch\n*** Delete File: {target}\n*** End Patch\n"},
                ),
            ):
                r = await sess.call(tool, args)
                assert r.error.code == "PERMISSION_DENIED", (tool, r.error)
                assert name in r.error.message and "read-only" in r.error.message
    assert (ws / "f.txt").read_text() == "orig\n" and (data / "g.txt").read_text() == "bound\n"


@pytest.mark.parametrize(
    "command",
    [
        "sleep 1000",
        "sh -c 'sleep 1000 & sleep 1000'",
        "setsid sleep 1000 & nohup sleep 1000 & sleep 1000",
    ],
)
async def test_timeout_kills_everything(make_config: Any, tmp_path: Path, command: str) -> None:
    """A timed-out command and every process it started (even a setsid'd one) are gone afterwards."""
    config = sandbox_config(make_config, tmp_path / "ws")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:t")
        r = await sess.call("exec", {"command": f"echo started; {command}", "timeout_s": 1})
        assert r.error.code == "TIMEOUT" and "started" in r.output["output"]
        ps = await sess.call("exec", {"command": "ps -eo args --no-headers"})
        assert "sleep 1000" not in ps.output["output"], ps.output["output"]


async def test_concurrent_edits_lose_nothing(make_config: Any, tmp_path: Path) -> None:
    """10 tasks edit one file at once: each edit applies or gets CONFLICT, and no applied edit is lost."""
    config = sandbox_config(make_config, tmp_path / "ws")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:edits")
        await sess.call("write", {"path": "f.txt", "content": "".join(f"line {i}\n" for i in range(10))})
        results: dict[int, Any] = {}

        async def edit(i: int) -> None:
            results[i] = await sess.call(
                "edit", {"path": "f.txt", "old_string": f"line {i}\n", "new_string": f"LINE {i}\n"}
            )

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(edit, i)
        final = (tmp_path / "ws" / "f.txt").read_text()
        for i, r in results.items():
            assert r.ok or r.error.code == "CONFLICT", r.error
            if r.ok:
                assert f"LINE {i}\n" in final
        assert sum(r.ok for r in results.values()) == 10


async def test_edit_conflict_when_file_changed_since_read(make_config: Any, tmp_path: Path) -> None:
    """An edit after someone else changed the file (since this session read it) is a CONFLICT."""
    config = sandbox_config(make_config, tmp_path / "ws")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:conf")
        await sess.call("write", {"path": "f.txt", "content": "one\ntwo\n"})
        assert (await sess.call("read", {"path": "f.txt"})).ok
        await sess.call("exec", {"command": "echo three >> f.txt"})
        r = await sess.call("edit", {"path": "f.txt", "old_string": "one", "new_string": "1"})
        assert r.error.code == "CONFLICT" and "read it again" in r.error.message
        assert (await sess.call("read", {"path": "f.txt"})).ok
        assert (await sess.call("edit", {"path": "f.txt", "old_string": "one", "new_string": "1"})).ok
        many = await sess.call("edit", {"path": "f.txt", "old_string": "t", "new_string": "T"})
        assert many.error.code == "INVALID_ARGUMENTS" and "occurs 2 times" in many.error.message


async def test_apply_patch_with_one_bad_hunk_changes_nothing(make_config: Any, tmp_path: Path) -> None:
    """A multi-file patch whose last hunk fails changes no file and names the file and hunk."""
    ws = tmp_path / "ws"
    config = sandbox_config(make_config, ws)
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:patch")
        await sess.call("write", {"path": "a.txt", "content": "alpha\n"})
        await sess.call("write", {"path": "b.txt", "content": "beta\n"})
        patch = (
            "*** Begin Patch\n*** Update File: a.txt\n@@\n-alpha\n+ALPHA\n*** Add File: c.txt\n+new\n"
            "*** Delete File: a.txt\n*** Update File: b.txt\n@@\n-gamma\n+GAMMA\n*** End Patch\n"
        )
        r = await sess.call("apply_patch", {"input": patch.replace("*** Delete File: a.txt\n", "")})
        assert r.error.code == "INVALID_ARGUMENTS"
        assert "/workspace/b.txt: hunk 1 does not apply" in r.error.message
    assert (ws / "a.txt").read_text() == "alpha\n" and (ws / "b.txt").read_text() == "beta\n"
    assert not (ws / "c.txt").exists()


async def test_five_megabytes_of_output_truncated_and_saved(make_config: Any, tmp_path: Path) -> None:
    """5 MB of output is cut with a marker and saved whole under .sandbox/outputs/."""
    ws = tmp_path / "ws"
    config = sandbox_config(make_config, ws)
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:big")
        r = await sess.call("exec", {"command": "head -c 5000000 /dev/zero | tr '\\0' 'y'"})
    assert r.ok and r.truncated
    assert len(r.output["output"]) < 51_000
    # the middle never sat in the orchestrator's memory: captured host-side, then copied in
    assert "of 5,000,000 bytes cut; full output in .sandbox/outputs/" in r.output["output"]
    assert r.full_output_path == f".sandbox/outputs/{r.call_id}.txt"  # workspace-relative, never a host path
    saved = ws / ".sandbox" / "outputs" / f"{r.call_id}.txt"
    assert saved.stat().st_size == 5_000_000


async def test_deny_patterns_and_protected_paths(make_config: Any, tmp_path: Path) -> None:
    """.env and *.pem are refused for read and write; .git/hooks stays read-only in a rw workspace."""
    ws = tmp_path / "ws"
    config = sandbox_config(make_config, ws)
    (ws / ".env").write_text("SECRET=1\n")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:deny")
        for tool, args in (
            ("read", {"path": ".env"}),
            ("write", {"path": "keys/server.pem", "content": "x"}),
            ("write", {"path": ".git/hooks/pre-commit", "content": "evil"}),
            ("write", {"path": ".git/config", "content": "evil"}),
        ):
            r = await sess.call(tool, args)
            assert r.error.code == "PERMISSION_DENIED", (tool, r.error)
    assert not (ws / "keys").exists()
    # protected paths are made (empty) before the container starts, so they can be mounted read-only
    assert (ws / ".git" / "config").read_text() == "" and list((ws / ".git" / "hooks").iterdir()) == []


async def test_process_tool_lifecycle_and_session_scoping(make_config: Any, tmp_path: Path) -> None:
    """poll, log, write (stdin) and kill work; another session cannot see or touch the process."""
    config = sandbox_config(make_config, tmp_path / "ws", scope="agent")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:p1")
        start = await sess.call(
            "exec",
            {"command": "echo ready; while read line; do echo got:$line; done", "background": True},
        )
        pid = start.output["process_id"]
        await anyio.sleep(0.5)
        assert (await sess.call("process", {"action": "write", "id": pid, "data": "hello\n"})).ok
        await anyio.sleep(0.5)
        polled = await sess.call("process", {"action": "poll", "id": pid})
        assert polled.output["status"] == "running" and "got:hello" in polled.output["output"]
        again = await sess.call("process", {"action": "poll", "id": pid})
        assert again.output["output"] == ""  # only new output
        log = await sess.call("process", {"action": "log", "id": pid, "offset": 0, "limit": 5})
        assert log.output["output"] == "ready"
        other = orch.session("agent:a:p2")
        for action in ("poll", "kill", "log"):
            r = await other.call("process", {"action": action, "id": pid})
            assert r.error.code == "INVALID_ARGUMENTS" and "no process" in r.error.message
        assert (await other.call("process", {"action": "list"})).output["processes"] == []
        killed = await sess.call("process", {"action": "kill", "id": pid})
        assert killed.output["status"] in ("killed", "exited")
        listed = await sess.call("process", {"action": "list"})
        assert [p["id"] for p in listed.output["processes"]] == [pid]


async def test_yield_ms_returns_result_or_process(make_config: Any, tmp_path: Path) -> None:
    """yield_ms returns the result when done in time, else a process id to poll."""
    config = sandbox_config(make_config, tmp_path / "ws")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:y")
        quick = await sess.call("exec", {"command": "echo quick", "yield_ms": 3000})
        assert quick.output["status"] == "exited" and "quick" in quick.output["output"]
        slow = await sess.call("exec", {"command": "sleep 3; echo slow", "yield_ms": 200})
        assert slow.output["status"] == "running"
        await anyio.sleep(3.5)
        done = await sess.call("process", {"action": "poll", "id": slow.output["process_id"]})
        assert done.output["status"] == "exited" and "slow" in done.output["output"]


PROC_SCRIPT = """
import anyio, json, sys
from sandbox import Orchestrator, load_config
async def main():
    async with Orchestrator(load_config(sys.argv[1])) as orch:
        sess = orch.session("agent:a:restart")
        if sys.argv[2] == "start":
            r = await sess.call("exec", {"command": "for i in 1 2 3 4; do echo n$i; sleep 0.5; done", "background": True})
        else:
            r = await sess.call("process", {"action": "poll", "id": sys.argv[3]})
        print(r.model_dump_json())
anyio.run(main)
"""


async def test_process_survives_orchestrator_restart(tmp_path: Path, instance: str) -> None:
    """A process started by one orchestrator process is polled by the next one."""
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\nagents: {{defaults: {{sandbox: {{mode: all, scope: agent}}}}, list: [{{id: a, workspace: {ws}}}]}}\n"
    )

    def run(*args: str) -> Any:
        out = subprocess.run(
            [sys.executable, "-c", PROC_SCRIPT, str(cfg), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return json.loads(out.stdout)

    started = run("start")
    await anyio.sleep(2.5)
    polled = run("poll", started["output"]["process_id"])
    assert polled["output"]["status"] == "exited"
    assert polled["output"]["output"].split() == ["n1", "n2", "n3", "n4"]


WRITER = """
import anyio, sys
from sandbox import Orchestrator, load_config
async def main():
    async with Orchestrator(load_config(sys.argv[1])) as orch:
        sess = orch.session("agent:a:writer")
        n = 0
        while True:
            body = ("A" if n % 2 else "B") * 4_000_000
            await sess.call("write", {"path": "big.txt", "content": body})
            n += 1
            print(n, flush=True)
anyio.run(main)
"""


async def test_kill_9_mid_write_leaves_old_or_new(tmp_path: Path, instance: str) -> None:
    """SIGKILL of the orchestrator while it writes leaves the file all-old or all-new, never mixed."""
    import random

    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\n"
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: agent, workspace_access: rw}}}}, list: [{{id: a, workspace: {ws}}}]}}\n"
    )
    rng = random.Random(7)
    kills = 0
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "1"  # one whole write done: now writes follow back to back
        time.sleep(rng.uniform(0.0, 0.2))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        kills += 1
        data = (ws / "big.txt").read_bytes()
        assert len(data) == 4_000_000 and len(set(data)) == 1, (len(data), set(data[:10]))
    assert kills == 5


async def test_read_refuses_binary_and_big_files_and_pages_lines(make_config: Any, tmp_path: Path) -> None:
    """read refuses binary files and files over the cap (saying the size), and pages by lines."""
    ws = tmp_path / "ws"
    config = sandbox_config(make_config, ws)
    (ws / "bin.dat").write_bytes(b"\x7fELF\x00\x01" * 100)
    (ws / "big.txt").write_bytes(b"a" * (10 * 1024 * 1024 + 1))
    (ws / "lines.txt").write_text("".join(f"l{i}\n" for i in range(10)))
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:read")
        binary = await sess.call("read", {"path": "bin.dat"})
        assert binary.error.code == "INVALID_ARGUMENTS" and "binary file (600 bytes)" in binary.error.message
        big = await sess.call("read", {"path": "big.txt"})
        assert big.error.code == "INVALID_ARGUMENTS" and big.error.details["size"] == 10 * 1024 * 1024 + 1
        page = await sess.call("read", {"path": "lines.txt", "offset": 3, "limit": 2, "line_numbers": True})
        assert page.output["content"] == "4\tl3\n5\tl4\n" and page.output["total_lines"] == 10
        missing = await sess.call("read", {"path": "nope.txt"})
        assert missing.error.code == "FILE_NOT_FOUND"


async def test_exec_separate_streams_env_and_workdir(make_config: Any, tmp_path: Path) -> None:
    """stdout/stderr come separately on request; env merges over the config; workdir is relative."""
    config = sandbox_config(make_config, tmp_path / "ws", extra=", docker: {env: {A: from-config, B: kept}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:streams")
        await sess.call("write", {"path": "sub/x.txt", "content": "x"})
        r = await sess.call(
            "exec",
            {
                "command": "echo out; echo err >&2; echo $A $B; pwd",
                "merge_output": False,
                "env": {"A": "from-call"},
                "workdir": "sub",
            },
        )
        assert r.output["stdout"] == "out\nfrom-call kept\n/workspace/sub\n" and r.output["stderr"] == "err\n"
        outside = await sess.call("exec", {"command": "pwd", "workdir": "../../etc"})
        assert outside.error.code == "PERMISSION_DENIED"
        capped = await sess.call("exec", {"command": "true", "timeout_s": 99999})
        assert capped.ok and "lowered to the configured maximum" in capped.output["note"]


async def test_cancelled_call_kills_the_command_in_the_sandbox(make_config: Any, tmp_path: Path) -> None:
    """A call cancelled by its caller leaves nothing running in the container."""
    config = sandbox_config(make_config, tmp_path / "ws", scope="agent")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:cancel")
        await sess.call("exec", {"command": "true"})
        with anyio.move_on_after(1.0):
            await sess.call("exec", {"command": "sleep 978 & setsid sleep 978 & sleep 978"})
        ps = await sess.call("exec", {"command": "ps -eo args --no-headers"})
        assert "sleep 978" not in ps.output["output"], ps.output["output"]
