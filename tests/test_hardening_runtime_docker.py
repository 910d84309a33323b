"""Attacks on the orchestrator's host through the runtime: output floods, fork bombs, stuck stdin,
processes that outlive their caller, and one tenant taking every permit (real engine)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from sandbox import Orchestrator

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

SANDBOXED = "agents: {defaults: {sandbox: {mode: all, scope: session}}}"


async def tagged_left(sess: Any, call_id: str) -> list[int]:
    """Pids of a call still alive in the session's sandbox, as the host sees them."""
    box = await sess.sandbox()
    return list(await box.alive(call_id))


def cli_config(tmp_path: Path, instance: str, extra: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {
        "state_dir": str(tmp_path / "state"),
        "instance": instance,
        "agents": {"defaults": {"sandbox": {"mode": "all", "scope": "agent"}}},
    }
    data.update(extra or {})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


PEAK_RSS_WRAPPER = """
import runpy, sys
sys.argv = ["sandbox", *sys.argv[1:]]
try:
    runpy.run_module("sandbox", run_name="__main__")
finally:
    print(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).strip(), file=sys.stderr)
"""


async def test_flood_of_output_keeps_orchestrator_memory_bounded(tmp_path: Path, instance: str) -> None:
    """A sandbox printing 400 MB: the orchestrator stays under 150 MB RSS; the output is cut (too big
    for the saved-outputs budget, its capture on the host is dropped)."""
    config = cli_config(tmp_path, instance, {"tools": {"exec": {"max_output_bytes": 1024**3}}})
    size = 400 * 1024 * 1024
    cmd = f"head -c {size} /dev/zero | tr '\\0' x; echo; echo END-OF-OUTPUT"
    # The CLI is the orchestrator here. Its peak RSS is read by the process itself at exit from
    # /proc/self/status VmHWM: the high-water mark of its own memory since exec. (wait4's
    # ru_maxrss would also count the forking parent's pages before exec: a big test worker.)
    argv = ["--config", str(config), "call", "--session", "flood", "exec", json.dumps({"command": cmd}), "--json"]
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-c", PEAK_RSS_WRAPPER, *argv], capture_output=True, text=True, timeout=600
        )
    )
    stdout = done.stdout
    peak = [line for line in done.stderr.splitlines() if line.startswith("VmHWM:")]
    assert peak, done.stderr[-2000:]
    rss_mib = int(peak[-1].split()[1]) / 1024
    proc = done
    result = json.loads(stdout)
    assert proc.returncode == 0 and result["ok"], result
    text = result["output"]["output"]
    assert text.startswith("x") and text.rstrip().endswith("END-OF-OUTPUT")
    assert "bytes cut" in text and result["truncated"]
    # 400 MB is over the saved-outputs budget: no copy is kept, and none is left on the host
    assert result["full_output_path"] is None and "not saved" in result["output"]["note"], result["output"]["note"]
    assert not any((tmp_path / "state" / "outputs").rglob("*.txt"))
    print(f"orchestrator peak RSS while the sandbox printed {size >> 20} MiB: {rss_mib:.1f} MiB")
    assert rss_mib < 150, rss_mib


async def test_output_past_the_maximum_stops_the_command(make_config: Any) -> None:
    """`yes` forever: stopped at tools.exec.max_output_bytes with QUOTA_EXCEEDED, nothing left running."""
    config = make_config(f"tools: {{exec: {{max_output_bytes: 2000000}}}}\n{SANDBOXED}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:yes")
        result = await sess.call("exec", {"command": "yes flood", "timeout_s": 120})
        assert not result.ok and result.error is not None
        assert result.error.code == "QUOTA_EXCEEDED"
        assert "tools.exec.max_output_bytes" in result.error.message
        assert await tagged_left(sess, result.call_id) == []
        ps = await sess.call("exec", {"command": "ps -eo comm= | grep -c '^yes$' || true"})
        assert ps.ok and ps.output["output"].strip() == "0"


async def test_fork_bomb_timeout_kills_from_outside_and_sandbox_recovers(make_config: Any) -> None:
    """With the pids limit used up no kill can fork inside; the kill from the host still ends it all."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: session, docker: {pids_limit: 32}}}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:bomb2")
        result = await sess.call(
            # the main shell then loops on builtins only: it needs no fork, so it reliably hits the timeout
            "exec",
            {"command": "bomb() { bomb | bomb & }; bomb; while :; do :; done", "timeout_s": 4},
        )
        assert not result.ok and result.error is not None and result.error.code == "TIMEOUT"
        assert await tagged_left(sess, result.call_id) == []
        after = await sess.call("exec", {"command": "ps -e -o stat= | grep -vc '^Z'"})  # zombies: not yet reaped
        assert after.ok, after
        assert int(after.output["output"].split()[-1]) < 8


async def test_calls_leave_no_pid_files_on_the_tmpfs(make_config: Any) -> None:
    """One pid file per call left in /tmp (a 256m tmpfs) filled a long-lived container's /tmp
    after some 65,000 calls: the resident agent removes each once its command is over, killed
    ones too, but keeps it while the call's process group still has a member (a kill of the call
    still needs the group). Exit statuses are what the commands said."""
    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: agent}}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:pids")
        for code in (0, 3, 0, 1):
            done = await sess.call("exec", {"command": f"echo hi; exit {code}"})
            assert done.output["exit_code"] == code, done
        slow = await sess.call("exec", {"command": "sleep 30 & sleep 30", "timeout_s": 1})
        assert slow.error is not None and slow.error.code == "TIMEOUT"
        assert await tagged_left(sess, slow.call_id) == []
        lingering = await sess.call("exec", {"command": "sleep 30 >/dev/null 2>&1 &"})
        assert lingering.ok, lingering
        listed = await sess.call("exec", {"command": "find /tmp -name '*.pid*' -printf '%f\\n' 2>/dev/null"})
        assert listed.ok, listed
        # the listing call's own file, and the one whose group still has its `sleep` (the killed
        # call's may stay too: its children may not be reaped yet when its shell's end is seen)
        found = set(listed.output["output"].split()) - {f"{slow.call_id}.pid"}
        assert found == {f"{listed.call_id}.pid", f"{lingering.call_id}.pid"}
        await sess.call("exec", {"command": "pkill -f 'sleep 30' || true"})


async def test_kill_falls_back_inside_when_host_cannot_see(make_config: Any, monkeypatch: Any) -> None:
    """A remote-like engine (host pids invisible): the in-container kill is used and confirmed."""
    from sandbox.runtime.docker import kill as docker_kill

    monkeypatch.setattr(docker_kill, "container_pids", lambda api, cid: None)
    async with Orchestrator(make_config(SANDBOXED)) as orch:
        sess = orch.session("agent:main:remote")
        result = await sess.call("exec", {"command": "sleep 300 & sleep 300", "timeout_s": 1})
        assert result.error is not None and result.error.code == "TIMEOUT"
        assert "could not be confirmed" not in result.error.message
        ps = await sess.call("exec", {"command": "ps -eo args= | grep -c '^sleep 300' || true"})
        assert ps.output["output"].strip() == "0"
        # a child without the call's tag outlives its shell and holds the call open: the shell's
        # pid file stays for the process-group kill (its exit trap keeps it when `$!` is set)
        untagged = await sess.call("exec", {"command": "env -u SBX_CALL sleep 301 & exit 0", "timeout_s": 1})
        assert untagged.error is not None and untagged.error.code == "TIMEOUT"
        ps = await sess.call("exec", {"command": "ps -eo args= | grep -c '^sleep 301' || true"})
        assert ps.output["output"].strip() == "0"


# leaves its process group, then its main thread ends while another runs on, writing a beat:
# /proc shows the process as a zombie, and neither its command line nor its environment (the
# call's tag) can be read through it
LEADER_EXITS = (
    "setsid python3 -c 'import ctypes, threading, time\n"
    "def beat():\n"
    "    while True:\n"
    '        open("/tmp/beat", "a").write("x"); time.sleep(0.1)\n'
    "threading.Thread(target=beat).start(); time.sleep(0.3); ctypes.CDLL(None).pthread_exit(None)' "
    "</dev/null >/dev/null 2>&1 & sleep 300"
)
BEAT = "sleep 0.5; wc -c < /tmp/beat; sleep 1; wc -c < /tmp/beat"


@pytest.mark.parametrize("where", ["host", "inside"])
async def test_a_process_whose_leader_thread_exited_is_killed_with_its_call(
    make_config: Any, monkeypatch: Any, where: str
) -> None:
    """From the host and from inside (a remote-like engine), the kill finds such a process by the
    call's tag through its live thread: nothing of the call runs on."""
    from sandbox.runtime.docker import kill as docker_kill

    if where == "inside":
        monkeypatch.setattr(docker_kill, "container_pids", lambda api, cid: None)
    async with Orchestrator(make_config(SANDBOXED)) as orch:
        sess = orch.session(f"agent:main:leader-{where}")
        result = await sess.call("exec", {"command": LEADER_EXITS, "timeout_s": 2})
        assert result.error is not None and result.error.code == "TIMEOUT", result
        assert "could not be confirmed" not in result.error.message
        monkeypatch.undo()
        before, after = (await sess.call("exec", {"command": BEAT})).output["output"].split()
        assert int(before) > 0 and before == after, (before, after)  # its thread beats no more


async def test_unconfirmed_kill_restarts_the_sandbox(make_config: Any, monkeypatch: Any) -> None:
    """When no kill can be confirmed, the result says so and the sandbox is replaced (nothing survives)."""
    from sandbox.runtime.docker import kill as docker_kill
    from sandbox.runtime.docker.sandbox import DockerSandbox

    monkeypatch.setattr(docker_kill, "container_pids", lambda api, cid: None)

    async def never_confirms(
        self: Any, call_id: str, signal: str, *, user: str | None, pid_dir: str | None = None
    ) -> bool:
        return False

    monkeypatch.setattr(DockerSandbox, "_kill", never_confirms)
    async with Orchestrator(make_config(SANDBOXED)) as orch:
        sess = orch.session("agent:main:stuck")
        first = (await sess.sandbox()).id
        result = await sess.call("exec", {"command": "sleep 300", "timeout_s": 1})
        assert result.error is not None and result.error.code == "TIMEOUT"
        assert "could not be confirmed dead, so the sandbox was removed" in result.error.message
        monkeypatch.undo()
        again = await sess.call("exec", {"command": "ps -eo args= | grep -c '^sleep 300' || true"})
        assert again.ok and again.output["output"].strip() == "0"
        assert (await sess.sandbox()).id != first


async def test_yield_ms_keeps_the_timeout_after_returning(make_config: Any) -> None:
    """exec with yield_ms returns early, and the command is still killed at its timeout_s."""
    async with Orchestrator(make_config(SANDBOXED)) as orch:
        sess = orch.session("agent:main:yield")
        started = await sess.call("exec", {"command": "sleep 300; echo never", "yield_ms": 200, "timeout_s": 2})
        assert started.ok and started.output["status"] == "running"
        proc_id = started.output["process_id"]
        with anyio.fail_after(30):
            while True:
                polled = await sess.call("process", {"action": "poll", "id": proc_id})
                if polled.output["status"] != "running":
                    break
                await anyio.sleep(0.5)
        assert polled.output["status"] == "timed_out", polled.output
        ps = await sess.call("exec", {"command": "ps -eo args= | grep -c '^sleep 300' || true"})
        assert ps.output["output"].strip() == "0"


async def test_process_write_to_a_process_that_never_reads_returns(make_config: Any) -> None:
    """Writing more than a pipe holds to a process that never reads ends with TIMEOUT, not a hang."""
    async with Orchestrator(make_config(SANDBOXED)) as orch:
        sess = orch.session("agent:main:stdin")
        started = await sess.call("exec", {"command": "sleep 300", "background": True})
        proc_id = started.output["process_id"]
        too_big = await sess.call("process", {"action": "write", "id": proc_id, "data": "x" * 200_000})
        assert too_big.error is not None and too_big.error.code == "INVALID_ARGUMENTS"
        assert "tools.exec.max_stdin_bytes" in too_big.error.message
        first = await sess.call("process", {"action": "write", "id": proc_id, "data": "x" * 60_000})
        assert first.ok, first
        t0 = time.monotonic()
        second = await sess.call("process", {"action": "write", "id": proc_id, "data": "y" * 60_000})
        assert second.error is not None and second.error.code == "TIMEOUT"
        assert "not reading its standard input" in second.error.message
        assert time.monotonic() - t0 < 60
        reader = await sess.call("exec", {"command": "cat", "background": True})
        ok = await sess.call("process", {"action": "write", "id": reader.output["process_id"], "data": "hello\n"})
        assert ok.ok and ok.output == {"written": 6}


def test_cli_process_write_does_not_hang(tmp_path: Path, instance: str) -> None:
    """`sandbox call process write` of 64 KB to a process that never reads exits by itself."""
    config = cli_config(tmp_path, instance)
    base = [sys.executable, "-m", "sandbox", "--config", str(config)]
    started = subprocess.run(
        [*base, "call", "--session", "w", "exec", '{"command": "sleep 120", "background": true}', "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    proc_id = json.loads(started.stdout)["output"]["process_id"]
    data = json.dumps({"action": "write", "id": proc_id, "data": "z" * 65_000})
    for _ in range(2):
        done = subprocess.run(
            [*base, "call", "--session", "w", "process", data, "--json"], capture_output=True, text=True, timeout=90
        )
    result = json.loads(done.stdout)
    assert done.returncode == 1 and result["error"]["code"] == "TIMEOUT"


async def test_three_tenants_share_exec_permits_fairly(make_config: Any, tmp_path: Path) -> None:
    """Tenant A floods exec (limit 2) with sleeps; B and C still start at once, and turns alternate."""
    config = make_config(f"""
limits: {{global_concurrency: 10, categories: {{exec: 2}}, queue: {{max_depth: 100, max_wait_s: 60}}}}
agents:
  defaults: {{sandbox: {{mode: all, scope: agent}}}}
  list:
    - {{id: a, tenant: ta, workspace: "{tmp_path / "wa"}"}}
    - {{id: b, tenant: tb, workspace: "{tmp_path / "wb"}"}}
    - {{id: c, tenant: tc, workspace: "{tmp_path / "wc"}"}}
""")
    waits: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    async with Orchestrator(config) as orch:
        sessions = {t: orch.session(f"agent:{t}:s1") for t in waits}
        for sess in sessions.values():  # containers first, so the measure is the queue alone
            assert (await sess.call("exec", {"command": "true"})).ok
        t0 = anyio.current_time()

        async def call(tenant: str) -> None:
            result = await sessions[tenant].call("exec", {"command": "sleep 1"})
            assert result.ok, result
            ran_s = result.output["duration_ms"] / 1000
            waits[tenant].append(anyio.current_time() - t0 - ran_s)

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(call, "a")
            await anyio.sleep(0.3)
            for tenant in ("b", "c"):
                for _ in range(2):
                    tg.start_soon(call, tenant)
    first = {t: min(w) for t, w in waits.items()}
    last = {t: max(w) for t, w in waits.items()}
    print(f"first start after (s): {first}; last: {last}")
    # A holds at most one of the two exec permits, so B and C are served well before A's backlog
    assert last["b"] < last["a"] and last["c"] < last["a"]
    assert first["b"] < 3 and first["c"] < 4


async def test_workspace_quota_stops_a_command_and_refuses_writes(make_config: Any, tmp_path: Path) -> None:
    """A sandbox filling its workspace is stopped near sandbox.workspace_quota; file tools then refuse to grow it."""
    from sandbox.fs.quota import disk_usage

    config = make_config("agents: {defaults: {sandbox: {mode: all, scope: session, workspace_quota: 20m}}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:filler")
        # 1 MiB every 50 ms, up to 400 MiB: the measurement (every second) catches it early
        fill = "for i in $(seq 400); do head -c 1048576 /dev/zero > f$i; sleep 0.05; done; echo done"
        result = await sess.call("exec", {"command": fill, "timeout_s": 120})
        assert result.error is not None and result.error.code == "QUOTA_EXCEEDED", result
        assert "sandbox.workspace_quota" in result.error.message
        box = await sess.sandbox()
        workspace = Path(box.spec.mounts[0].source)
        used = disk_usage(workspace)
        print(f"workspace quota 20 MiB: the command was stopped at {used / 2**20:.1f} MiB")
        assert used < 80 * 2**20
        assert await tagged_left(sess, result.call_id) == []
        refused = await sess.call("write", {"path": "more.txt", "content": "x" * 1000})
        assert refused.error is not None and refused.error.code == "QUOTA_EXCEEDED"
        assert not (workspace / "more.txt").exists()
        # the model can free space and go on
        assert (await sess.call("exec", {"command": "rm -f f*"})).ok
        assert (await sess.call("write", {"path": "more.txt", "content": "x" * 1000})).ok


async def test_file_tools_cannot_grow_a_workspace_past_its_quota(make_config: Any) -> None:
    """write and edit(replace_all) that would pass the quota are refused before anything is written."""
    config = make_config(
        "tools: {fs: {max_write_bytes: 50000000}}\n"
        "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_quota: 2500k}}}"
    )
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:grow")
        assert (await sess.call("write", {"path": "a.txt", "content": "ab" * 500_000})).ok  # 1 MB
        edit = await sess.call(
            "edit", {"path": "a.txt", "old_string": "a", "new_string": "aaaaaaaa", "replace_all": True}
        )
        assert edit.error is not None and edit.error.code == "QUOTA_EXCEEDED", edit
        # the file is as it was (looked at by exec: a read of its 1 MB line would save the full
        # output in the workspace, and that copy counts toward the quota too)
        head = await sess.call("exec", {"command": "head -c 4 a.txt"})
        assert head.ok and head.output["output"] == "abab", head
        assert (await sess.call("write", {"path": "b.txt", "content": "x" * 900_000})).ok
        over = await sess.call("write", {"path": "c.txt", "content": "x" * 900_000})
        assert over.error is not None and over.error.code == "QUOTA_EXCEEDED"
        files = await sess.call("exec", {"command": "ls"})
        assert "c.txt" not in files.output["output"]


async def test_one_session_filling_tmp_does_not_break_the_others(make_config: Any) -> None:
    """Agent scope: session 1 fills /tmp; session 2's exec still runs and reports honestly, and a
    background start says the sandbox is out of space (QUOTA_EXCEEDED), not a misleading ok/126."""
    config = make_config("""
agents: {defaults: {sandbox: {mode: all, scope: agent, docker: {tmpfs: {/tmp: "rw,nosuid,nodev,size=8m"}}}}}
""")
    async with Orchestrator(config) as orch:
        one, two = orch.session("agent:main:one"), orch.session("agent:main:two")
        filled = await one.call("exec", {"command": "cat /dev/zero > $TMPDIR/fill; df -k /tmp | tail -1"})
        assert filled.ok and " 100% " in filled.output["output"]
        ran = await two.call("exec", {"command": "echo still-running; echo $TMPDIR"})
        assert ran.ok and ran.output["exit_code"] == 0, ran
        # a TMPDIR per session, inside its own record directory (session users are on here)
        assert ran.output["output"].startswith("still-running\n/tmp/.sbx-")
        assert ran.output["output"].split()[1] not in filled.output["output"]  # a TMPDIR per session
        # a background process still starts, and its exit status is kept though /tmp is full
        bg = await two.call("exec", {"command": "sleep 1; exit 3", "background": True})
        assert bg.ok, bg
        with anyio.fail_after(30):
            while (polled := await two.call("process", {"action": "poll", "id": bg.output["process_id"]})).output[
                "status"
            ] == "running":
                await anyio.sleep(0.3)
        assert polled.output["status"] == "exited" and polled.output["exit_code"] == 3, polled
