"""Sessions sharing an agent-scoped container, as attacks against the real engine (issue 10, item 5).

Alice runs a background process holding a secret in its environment; Bob, another session of the
same agent in the same container, tries what one uid used to allow: read the environment, rewrite
the output file, fake the exit status, write the stdin fifo, signal the process, squat a record
directory. Each attempt fails, and Alice's `process poll` returns only what her process printed.
The workspace stays shared between them (group-writable), as README says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.runtime.session_users import allocate, registry_of

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

SECRET = "alice-secret-4711"
ECHO_LOOP = 'while read l; do echo "got:$l"; done'

BOB_ATTACKS = r"""
echo "uid $(id -u)"
n=$(cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c alice-secret); echo "environ hits $n"
pid="$TARGET"; echo "target ${pid:-none}"  # Alice's pid, told: with hidepid Bob cannot find it
cat "/proc/$pid/environ" >/dev/null 2>&1 && echo "ENVIRON READ" || echo "environ refused"
ls "/proc/$pid/fd" >/dev/null 2>&1 && echo "FDS LISTED" || echo "fds refused"
for d in /tmp/.sbx-*; do
  [ -O "$d" ] && continue  # Bob's own records
  ls "$d" >/dev/null 2>&1 && echo "LISTED $d" || echo "list refused"
  for f in "$d"/*.out "$d"/p_*.out; do echo INJECTED >> "$f" 2>/dev/null && echo "WROTE $f"; done
  touch "$d/forged.exit-0" 2>/dev/null && echo "FORGED EXIT" || echo "exit refused"
  for f in "$d"/*.in; do printf 'INJECTED\n' > "$f" 2>/dev/null && echo "FED STDIN"; done
  chmod 777 "$d" 2>/dev/null && echo "CHMOD" || echo "chmod refused"
done
kill -9 "$pid" 2>/dev/null && echo "KILLED" || echo "kill refused"
echo done
"""


def agent_config(make_config: Any, extra: str = "") -> Any:
    return make_config(f"agents: {{defaults: {{sandbox: {{mode: all, scope: agent{extra}}}}}}}")


async def pid_of_loop(sess: Any) -> str:
    """The pid of the session's echo loop, as the session itself sees it."""
    found = await sess.call("exec", {"command": "pgrep -f 'while rea[d] l' | head -1"})
    assert found.ok and found.output["output"].strip().isdigit(), found
    return str(found.output["output"].strip())


async def wait_for(sess: Any, proc_id: str, text: str) -> dict[str, Any]:
    with anyio.fail_after(20):
        while True:
            polled = await sess.call("process", {"action": "poll", "id": proc_id})
            assert polled.ok, polled
            if text in polled.output["output"]:
                return dict(polled.output)
            await anyio.sleep(0.2)


async def test_another_session_cannot_read_forge_or_signal_background_processes(make_config: Any) -> None:
    """Bob's every attempt on Alice's process and records fails; her poll shows only her output."""
    async with Orchestrator(agent_config(make_config)) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        started = await alice.call("exec", {"command": ECHO_LOOP, "env": {"CANARY": SECRET}, "background": True})
        assert started.ok, started
        proc_id = started.output["process_id"]
        sent = await alice.call("process", {"action": "write", "id": proc_id, "data": "one\n"})
        assert sent.ok, sent
        await wait_for(alice, proc_id, "got:one")

        whoami = await alice.call("exec", {"command": "id -u"})
        attack = await bob.call("exec", {"command": BOB_ATTACKS, "env": {"TARGET": await pid_of_loop(alice)}})
        out = attack.output["output"]
        assert attack.ok and out.rstrip().endswith("done"), attack
        # two sessions, two uids
        assert whoami.output["output"].strip() != out.split("\n")[0].split()[1]
        assert "environ hits 0" in out and "target none" not in out
        for refused in ("kill refused", "environ refused", "fds refused", "list refused", "exit refused"):
            assert refused in out, out
        for success in ("KILLED", "ENVIRON READ", "FDS LISTED", "LISTED", "WROTE", "FORGED", "FED STDIN", "CHMOD"):
            assert success not in out, out

        # Bob's process tools do not know Alice's process id either
        poked = await bob.call("process", {"action": "poll", "id": proc_id})
        assert poked.error is not None and "no process" in poked.error.message, poked

        sent = await alice.call("process", {"action": "write", "id": proc_id, "data": "two\n"})
        assert sent.ok, sent
        polled = await wait_for(alice, proc_id, "got:two")
        assert polled["status"] == "running"
        log = await alice.call("process", {"action": "log", "id": proc_id})
        assert log.ok and log.output["output"] == "got:one\ngot:two\n", log
        killed = await alice.call("process", {"action": "kill", "id": proc_id})
        assert killed.ok, killed


async def test_the_workspace_stays_shared_between_sessions(make_config: Any) -> None:
    """What one session writes (file tool or exec), another session of the agent can change."""
    async with Orchestrator(agent_config(make_config)) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        wrote = await alice.call("write", {"path": "notes/plan.txt", "content": "alice\n"})
        assert wrote.ok, wrote
        made = await alice.call("exec", {"command": "mkdir -p work/deep && echo a > work/deep/a.txt"})
        assert made.ok and made.output["exit_code"] == 0, made
        changed = await bob.call(
            "exec",
            {"command": "echo bob >> notes/plan.txt && echo b >> work/deep/a.txt && touch work/deep/b.txt && echo ok"},
        )
        assert changed.ok and changed.output["output"].strip() == "ok", changed
        read = await alice.call("read", {"path": "notes/plan.txt"})
        assert read.ok and read.output["content"] == "alice\nbob\n", read
        edited = await alice.call("edit", {"path": "work/deep/a.txt", "old_string": "b", "new_string": "B"})
        assert edited.ok, edited


async def test_a_squatted_record_directory_is_refused(make_config: Any, tmp_path: Path) -> None:
    """Bob pre-creates the directory Carol's records would use: Carol's start is refused, nothing read."""
    config = agent_config(make_config)
    async with Orchestrator(config) as orch:
        bob = orch.session("agent:main:bob")
        carol = orch.session("agent:main:carol")
        await bob.call("exec", {"command": "true"})  # the container exists
        box = await bob.sandbox()
        registry = registry_of(config.state_dir / "session-users", box.spec)
        # what Carol will get (as if Bob had guessed the name: he cannot, it hangs on a secret)
        carol_dir = allocate(registry, carol.key, 1000).pid_dir(box.id)
        squat = await bob.call(
            "exec",
            {"command": f"mkdir -m 777 {carol_dir} && echo forged > {carol_dir}/p_x.out && echo squatted"},
        )
        assert "squatted" in squat.output["output"], squat
        started = await carol.call("exec", {"command": "echo hi", "background": True})
        assert started.error is not None and started.error.code == "PERMISSION_DENIED", started
        assert "held by another user" in started.error.message
        # Carol's foreground commands still run (their pid file is optional)
        ran = await carol.call("exec", {"command": "echo still-works"})
        assert ran.ok and ran.output["output"].strip() == "still-works", ran


async def test_session_users_off_keeps_one_uid(make_config: Any) -> None:
    """`session_users: off` is the old trust domain: both sessions run as the sandbox user."""
    async with Orchestrator(agent_config(make_config, ", session_users: off")) as orch:
        a = await orch.session("agent:main:alice").call("exec", {"command": "id -u"})
        b = await orch.session("agent:main:bob").call("exec", {"command": "id -u"})
    assert a.output["output"].strip() == b.output["output"].strip() == "1000"


async def test_control_one_uid_lets_the_attack_through(make_config: Any) -> None:
    """The control: with `session_users: off` the same attack reads the secret and injects output."""
    async with Orchestrator(agent_config(make_config, ", session_users: off")) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        started = await alice.call("exec", {"command": ECHO_LOOP, "env": {"CANARY": SECRET}, "background": True})
        proc_id = started.output["process_id"]
        attack = await bob.call(
            "exec",
            {
                "command": BOB_ATTACKS.replace('[ -O "$d" ] && continue', "").replace("/tmp/.sbx-*", "/tmp/.sbx"),
                "env": {"TARGET": await pid_of_loop(alice)},
            },
        )
        out = attack.output["output"]
        assert "ENVIRON READ" in out and "environ hits 0" not in out, out
        assert "WROTE" in out and "FORGED EXIT" in out and "KILLED" in out, out
        log = await alice.call("process", {"action": "log", "id": proc_id})
        assert "INJECTED" in log.output["output"], log


async def test_tmpdir_is_private_and_git_works_across_sessions(make_config: Any) -> None:
    """A session's TMPDIR is inside its own directory (Bob cannot read Alice's temp files), and
    git works on a repository another session made (the workspace is shared on purpose)."""
    async with Orchestrator(agent_config(make_config)) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        tmp = await alice.call("exec", {"command": 'echo secret-temp > "$TMPDIR/t" && echo "$TMPDIR"'})
        alice_tmp = tmp.output["output"].strip()
        assert alice_tmp.startswith("/tmp/.sbx-") and alice_tmp.endswith("/tmp"), tmp
        peek = await bob.call("exec", {"command": f"cat {alice_tmp}/t 2>&1; ls {alice_tmp} 2>&1; echo end"})
        assert "secret-temp" not in peek.output["output"] and "Permission denied" in peek.output["output"]
        made = await alice.call(
            "exec",
            {
                "command": "git init -q repo && cd repo && echo x > f && git add f && "
                "git -c user.email=a@x -c user.name=a commit -qm one && echo made"
            },
        )
        assert "made" in made.output["output"], made
        status = await bob.call("exec", {"command": "cd repo && git log --oneline | wc -l && git status --short"})
        assert status.ok and status.output["exit_code"] == 0, status
        assert status.output["output"].split()[0] == "1", status


async def test_a_planted_pid_file_never_redirects_a_kill(make_config: Any) -> None:
    """In-container kills read only the caller's own pid files, and only numbers above 1:
    "1" planted in the shared directory does not turn a kill of one call into `kill -1`."""
    from sandbox.runtime import shellwrap

    async with Orchestrator(agent_config(make_config, ", session_users: off")) as orch:
        sess = orch.session("agent:main:alice")
        bg = await sess.call("exec", {"command": "sleep 120", "background": True})
        assert bg.ok, bg
        box = await sess.sandbox()
        planted = await box.run_argv(["sh", "-c", "mkdir -p /tmp/.sbx && echo 1 > /tmp/.sbx/c_victim.pid"])
        assert planted.exit_code == 0
        killed = await box.run_argv(shellwrap.kill_argv("c_victim", "KILL"))
        assert killed.exit_code == 0
        polled = await sess.call("process", {"action": "poll", "id": bg.output["process_id"]})
        assert polled.output["status"] == "running", polled
        await sess.call("process", {"action": "kill", "id": bg.output["process_id"]})


async def test_files_added_by_a_patch_are_shared_like_written_ones(make_config: Any) -> None:
    """In a workspace sessions share through the group, apply_patch's new files are 0664 like
    write's, so another session's commands can change them."""
    async with Orchestrator(agent_config(make_config)) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        patch = "*** Begin Patch\n*** Add File: added.txt\n+from alice\n*** End Patch\n"
        assert (await alice.call("apply_patch", {"input": patch})).ok
        assert (await alice.call("write", {"path": "written.txt", "content": "from alice\n"})).ok
        changed = await bob.call("exec", {"command": "echo bob >> added.txt && stat -c %a added.txt written.txt"})
        assert changed.ok and changed.output["output"] == "664\n664\n", changed


async def test_another_session_cannot_forge_or_read_a_durable_calls_outcome(make_config: Any) -> None:
    """A durable exec (submitted) keeps its records in the session's private folder while it runs:
    Bob, in the same sandbox, can neither inject output, forge an exit file, nor read the log, and
    Alice's handle gets her command's true outcome."""
    async with Orchestrator(agent_config(make_config)) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        handle = await alice.submit("exec", {"command": f"sleep 3; echo {SECRET}; exit 3"})
        with anyio.fail_after(20):  # her durable process is on its way: its records exist
            while not [e for e in orch.journal.events(call_id=handle.call_id) if e.stage == "durable_started"]:
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        attack = await bob.call(
            "exec",
            {
                "command": 'for d in /tmp/.sbx-*; do [ -O "$d" ] && continue; '
                'for f in "$d"/p_*.out; do cat "$f" 2>/dev/null; echo INJECTED >> "$f" 2>/dev/null && echo WROTE; done; '
                'for f in "$d"/p_*.pid; do id=$(basename "$f" .pid); touch "$d/$id.exit-0" 2>/dev/null && echo FORGED; done; '
                "done; echo done"
            },
        )
        assert attack.ok and attack.output["output"].strip().endswith("done"), attack
        assert "WROTE" not in attack.output["output"] and "FORGED" not in attack.output["output"]
        assert SECRET not in attack.output["output"]
        result = await handle.result(timeout_s=30)
        assert result.output is not None and result.output["exit_code"] == 3, result
        assert result.output["output"] == f"{SECRET}\n"  # her own output, nothing injected


async def test_a_registry_removed_by_hand_never_leaves_two_sessions_on_one_uid(make_config: Any) -> None:
    """A session remembers its uid between calls (no file walk per call), but checks the
    registry's entry before each use: when an operator removed the registry and another session
    was given that uid meanwhile, the first session is allocated a uid again, never shares one."""
    config = agent_config(make_config)
    async with Orchestrator(config) as orch:
        alice, bob = orch.session("agent:main:alice"), orch.session("agent:main:bob")
        first = await alice.call("exec", {"command": "id -u"})
        assert first.ok, first
        uid = int(first.output["output"].strip())
        box: Any = await alice.sandbox()
        registry = registry_of(config.state_dir / "session-users", box.spec)
        for entry in registry.iterdir():  # the operator's clean-up
            entry.unlink()
        # another session is given Alice's old uid (as a fresh registry could hand it out)
        (registry / str(uid)).write_text('{"session": "agent:main:bob", "token": "b0b"}')
        again = await alice.call("exec", {"command": "id -u"})
        assert again.ok, again
        now = int(again.output["output"].strip())
        assert now != uid
        assert json.loads((registry / str(now)).read_text())["session"] == "agent:main:alice"
        assert json.loads((registry / str(uid)).read_text())["session"] == "agent:main:bob"
        assert (await bob.call("exec", {"command": "true"})).ok
