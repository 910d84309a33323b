"""Issue 16 attacks on the control plane, host side: approvals show and run exactly one call,
fail closed, cover every spelling of a write and the process channel, decide once; loop detection
across processes; honest batch records; --provider/--sender on the CLI."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.engine.batch import BatchCall
from sandbox.errors import ConfigError, ErrorCode, SandboxError
from sandbox.journal.store import Approval, Journal
from tests.cli_helpers import run_cli

anyio_mark = pytest.mark.anyio
JOURNAL = "journal.sqlite3"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def host(make_config: Any, ws: Path, extra: str = "") -> Any:
    return make_config(
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}\n{extra}"
    )


def host_config_file(tmp_path: Path, ws: Path, extra: str = "") -> Path:
    cfg = tmp_path / "sandbox.yaml"
    cfg.write_text(
        f"state_dir: '{tmp_path / 'state'}'\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}\n{extra}"
    )
    return cfg


async def pending(orch: Orchestrator, count: int = 1) -> list[Approval]:
    """Wait until `count` approvals are pending."""
    with anyio.fail_after(20):
        while len(found := orch.pending_approvals()) < count:
            await anyio.sleep(0.05)
    return found


def stages(journal: Journal, call_id: str) -> list[str]:
    return [e.stage for e in journal.events(call_id=call_id)]


# -- 1: what the approver sees is exactly what runs --------------------------------------------

HIDDEN = 'echo "-----BEGIN RSA PRIVATE KEY-----"; touch ran-hidden; echo dG91Y2ggYjY0 | base64 -d | sh; echo "-----END RSA PRIVATE KEY-----"'


@anyio_mark
async def test_private_key_markers_hide_nothing_from_the_approver(make_config: Any, ws: Path, tmp_path: Path) -> None:
    """A command wrapped in PRIVATE KEY markers shows whole in approvals list, show and --json; it runs only when approved."""
    config = host(make_config, ws, "tools: {approvals: {require: [exec], timeout_s: 60}}")
    cfg = host_config_file(tmp_path, ws, "tools: {approvals: {require: [exec], timeout_s: 60}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")
        async with anyio.create_task_group() as tg:
            results: list[Any] = []

            async def run() -> None:
                results.append(await sess.call("exec", {"command": HIDDEN}))

            tg.start_soon(run)
            [waiting] = await pending(orch)
            listed = run_cli("approvals", "list", config=cfg)
            listed_json = run_cli("approvals", "list", "--json", config=cfg)
            shown = run_cli("approvals", "show", waiting.id, config=cfg)
            shown_json = run_cli("approvals", "show", waiting.id, "--json", config=cfg)
            assert not (ws / "ran-hidden").exists()  # nothing runs before the decision
            decided = run_cli("approvals", "approve", waiting.id, config=cfg)
        journal = orch.journal
        assert journal is not None
        record = journal.events(call_id=results[0].call_id)
    assert listed.returncode == shown.returncode == decided.returncode == 0, (listed.stderr, decided.stderr)
    assert "touch ran-hidden" in listed.stdout or "(+" in listed.stdout  # cut at 80 chars, marked
    assert json.loads(listed_json.stdout)[0]["arguments"]["command"] == HIDDEN
    assert "touch ran-hidden; echo dG91Y2ggYjY0 | base64 -d | sh" in shown.stdout and "***" not in shown.stdout
    assert json.loads(shown_json.stdout)["arguments"]["command"] == HIDDEN
    assert results[0].ok and (ws / "ran-hidden").exists() and (ws / "b64").exists()
    validated = next(e for e in record if e.stage == "validated")
    assert "touch ran-hidden" in validated.data["arguments"]["command"]  # stored: what ran, code visible
    assert [e.stage for e in record][-1] == "finished"


def test_pending_rows_keep_raw_arguments_and_decisions_mask_them(tmp_path: Path) -> None:
    """A pending approval keeps the exact arguments (read raw by the approver); the decision leaves only the masked copy."""
    journal = Journal(tmp_path / JOURNAL)
    command = "export API_TOKEN=s3cr3t-value; deploy"
    journal.add_approval(Approval("ap", "c", "t", "s", "a", "exec", {"command": command}, "pending", "", 0.0, None))
    raw = journal.approval("ap", raw=True)
    assert raw is not None and raw.arguments["command"] == command
    assert journal.approvals(raw=True)[0].arguments["command"] == command
    masked = journal.approval("ap")
    assert masked is not None and masked.arguments["command"] == "export API_TOKEN=***; deploy"
    journal.decide("ap", "denied", "no")
    after = journal.approval("ap", raw=True)
    journal.close()
    assert after is not None and after.arguments["command"] == "export API_TOKEN=***; deploy"
    stored = sqlite3.connect(tmp_path / JOURNAL).execute("SELECT arguments FROM approvals").fetchone()[0]
    assert "s3cr3t-value" not in stored


@anyio_mark
async def test_an_approval_whose_row_was_changed_runs_nothing(make_config: Any, ws: Path) -> None:
    """Arguments swapped in the approval row while pending: approving it runs nothing (read back, compared)."""
    config = host(make_config, ws, "tools: {approvals: {require: [write], timeout_s: 30}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")
        results: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await sess.call("write", {"path": "real.txt", "content": "x"}))

            tg.start_soon(run)
            [waiting] = await pending(orch)
            other = sqlite3.connect(config.state_dir / JOURNAL)
            other.execute(
                "UPDATE approvals SET arguments = ? WHERE id = ?",
                (json.dumps({"path": "harmless.txt", "content": "x"}), waiting.id),
            )
            other.commit()
            other.close()
            orch.approve(waiting.id)
    assert results[0].error.code == "INTERNAL" and "other arguments" in results[0].error.message
    assert not (ws / "real.txt").exists()


# -- 2: approvals fail closed -------------------------------------------------------------------


@pytest.mark.slow
@anyio_mark
async def test_a_locked_journal_at_expiry_runs_nothing(make_config: Any, ws: Path) -> None:
    """The journal locked past its busy timeout when the approval expires (then free again): the call does not run."""
    from sandbox.journal.store import Journal

    config = host(make_config, ws, "tools: {approvals: {require: [write], timeout_s: 0.3}}")
    # a short busy timeout (5 s by default) keeps the test quick; the behaviour is the same
    async with Orchestrator(config, journal=Journal(config.state_dir / JOURNAL, busy_timeout_s=0.6)) as orch:
        sess = orch.session("agent:a:main")
        results: list[Any] = []
        locked = threading.Event()

        def hold() -> None:
            # a thread: the journal's writes block the event loop while they wait for the lock
            locker = sqlite3.connect(config.state_dir / JOURNAL, isolation_level=None)
            locker.execute("BEGIN EXCLUSIVE")  # the expiry's write waits its busy timeout, then fails
            locked.set()
            time.sleep(1.2)  # past expiry (0.3 s) + busy timeout (0.6 s); free before the next write gives up (1.5 s)
            locker.execute("ROLLBACK")  # free again: later writes (the call's own) succeed
            locker.close()

        holder = threading.Thread(target=hold)
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await sess.call("write", {"path": "ran.txt", "content": "x"}))

            tg.start_soon(run)
            [waiting] = await pending(orch)
            holder.start()
            locked.wait(5)
        holder.join()
        journal = orch.journal
        assert journal is not None
        result = results[0]
        assert result.error.code == "APPROVAL_TIMEOUT" and "could not be recorded" in result.error.message, result.error
        assert not (ws / "ran.txt").exists()
        assert stages(journal, result.call_id)[-2:] == ["awaiting_approval", "failed"]
        row = journal.approval(waiting.id)
        assert row is not None and row.status == "pending"  # the expiry could not be written...
        orch.approve(waiting.id)  # ...and approving it now, with its caller gone, runs nothing
        await anyio.sleep(0.3)
    assert not (ws / "ran.txt").exists()


@anyio_mark
@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_closed_journal_while_waiting_runs_nothing(make_config: Any, ws: Path) -> None:
    """The journal closed under a waiting call (cannot be read back): the call does not run."""
    config = host(make_config, ws, "tools: {approvals: {require: [write], timeout_s: 0.5}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")
        results: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await sess.call("write", {"path": "ran.txt", "content": "x"}))

            tg.start_soon(run)
            await pending(orch)
            assert orch.journal is not None
            orch.journal.close()
    assert not results[0].ok and results[0].error.code in ("APPROVAL_TIMEOUT", "INTERNAL")
    assert not (ws / "ran.txt").exists()


@pytest.mark.parametrize(
    "approvals",
    [
        "tools: {approvals: {require: [exec]}}",
        "tools: {approvals: {by_agent: {a: [write]}}}",
        "tools: {approvals: {by_sender: {mallory: [group:fs]}}}",
    ],
)
def test_approvals_without_a_journal_are_a_startup_error(make_config: Any, ws: Path, approvals: str) -> None:
    """An orchestrator built without a journal refuses configured approvals instead of dropping them."""
    with pytest.raises(ConfigError, match="no journal"):
        Orchestrator(host(make_config, ws, approvals), journal=False)
    Orchestrator(host(make_config, ws), journal=False)  # nothing to approve: fine


# -- 3: which tools a rule covers -------------------------------------------------------------


@anyio_mark
@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_require_write_covers_edit_and_apply_patch(make_config: Any, ws: Path) -> None:
    """`require: [write]` gates edit and apply_patch too; nothing changes without a decision."""
    (ws / "f.txt").write_text("old\n")
    config = host(make_config, ws, "tools: {approvals: {require: [write], timeout_s: 0.3}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")
        edit = await sess.call("edit", {"path": "f.txt", "old_string": "old", "new_string": "new"})
        patch = "*** Begin Patch\n*** Add File: added.txt\n+x\n*** End Patch\n"
        patched = await sess.call("apply_patch", {"input": patch})
        read = await sess.call("read", {"path": "f.txt"})
    assert edit.error.code == patched.error.code == "APPROVAL_TIMEOUT"
    assert (ws / "f.txt").read_text() == "old\n" and not (ws / "added.txt").exists()
    assert read.ok


@anyio_mark
async def test_deny_write_removes_edit(make_config: Any, ws: Path) -> None:
    """`deny: [write]` removes edit and apply_patch: TOOL_NOT_FOUND, file unchanged."""
    (ws / "f.txt").write_text("old\n")
    async with Orchestrator(host(make_config, ws, "tools: {deny: [write]}")) as orch:
        edit = await orch.session("agent:a:main").call(
            "edit", {"path": "f.txt", "old_string": "old", "new_string": "x"}
        )
    assert edit.error.code == "TOOL_NOT_FOUND" and (ws / "f.txt").read_text() == "old\n"


@pytest.mark.slow
@anyio_mark
async def test_process_write_to_an_approved_interpreter_needs_approval(make_config: Any, ws: Path) -> None:
    """With exec gated, `process write` and `kill` to an approved shell wait for approval too; poll does not."""
    config = host(make_config, ws, "tools: {approvals: {require: [exec], timeout_s: 0.25}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")
        started: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                command = 'while read line; do eval "$line"; done'
                started.append(await sess.call("exec", {"command": command, "background": True}))

            tg.start_soon(run)
            [waiting] = await pending(orch)
            orch.approve(waiting.id)
        pid = started[0].output["process_id"]
        sent = await sess.call("process", {"action": "write", "id": pid, "data": "touch pwned\n"})
        killed = await sess.call("process", {"action": "kill", "id": pid})
        polled = await sess.call("process", {"action": "poll", "id": pid})
        await anyio.sleep(0.3)
        assert sent.error.code == killed.error.code == "APPROVAL_TIMEOUT"
        assert polled.ok and polled.output["status"] == "running" and not (ws / "pwned").exists()
        results: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def stop() -> None:
                results.append(await sess.call("process", {"action": "kill", "id": pid}))

            tg.start_soon(stop)
            [waiting] = await pending(orch)
            assert waiting.tool == "process" and waiting.arguments["action"] == "kill"
            orch.approve(waiting.id)
    assert results[0].ok


@anyio_mark
@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_exec_denied_by_a_later_provider_closes_the_process_channel(make_config: Any, ws: Path) -> None:
    """A shell started while exec was allowed cannot be fed commands by a provider that denies exec."""
    config = host(make_config, ws, "tools: {by_provider: {acme: {deny: [exec]}}}")
    async with Orchestrator(config) as orch:
        allowed = orch.session("agent:a:main")
        start = await allowed.call("exec", {"command": 'while read line; do eval "$line"; done', "background": True})
        pid = start.output["process_id"]
        denied = orch.session("agent:a:main", provider="acme")
        sent = await denied.call("process", {"action": "write", "id": pid, "data": "touch pwned\n"})
        polled = await denied.call("process", {"action": "poll", "id": pid})
        await anyio.sleep(0.3)
        assert sent.error.code == "PERMISSION_DENIED" and "needs exec" in sent.error.message
        assert polled.ok and not (ws / "pwned").exists()
        assert (await allowed.call("process", {"action": "kill", "id": pid})).ok


# -- 4: one decision wins; the loser is told ----------------------------------------------------


def test_concurrent_deciders_exactly_one_wins(tmp_path: Path) -> None:
    """Eight deciders (own connections) race on each approval: one wins, seven get CONFLICT."""
    path = tmp_path / JOURNAL
    setup = Journal(path)
    for i in range(5):
        setup.add_approval(Approval(f"ap{i}", "c", "t", "s", "a", "exec", {}, "pending", "", 0.0, None))
    setup.close()
    for i in range(5):
        barrier = threading.Barrier(8)
        outcomes: list[str] = []

        def decide(
            n: int, approval_id: str = f"ap{i}", gate: threading.Barrier = barrier, seen: list[str] = outcomes
        ) -> None:
            journal = Journal(path)
            gate.wait()
            try:
                journal.decide(approval_id, "approved" if n % 2 else "denied", f"by {n}")
                seen.append("won")
            except SandboxError as exc:
                seen.append(exc.code.value)
            finally:
                journal.close()

        threads = [threading.Thread(target=decide, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["CONFLICT"] * 7 + ["won"]


@pytest.mark.slow
def test_cli_deciders_race_and_the_loser_exits_non_zero(tmp_path: Path, ws: Path) -> None:
    """`approvals approve` and `deny` at once: one exits 0, the other exits 1 saying it was already decided."""
    import subprocess
    import sys

    cfg = host_config_file(tmp_path, ws)
    journal = Journal(tmp_path / "state" / JOURNAL)
    journal.add_approval(Approval("ap", "c", "t", "s", "a", "exec", {}, "pending", "", 0.0, None))
    journal.close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "sandbox", "--config", str(cfg), "approvals", verb, "ap"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for verb in ("approve", "deny")
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append((proc.returncode, out, err))
    codes = sorted(code for code, _, _ in done)
    assert codes == [0, 1], done
    loser = next(d for d in done if d[0] == 1)
    assert "CONFLICT" in loser[2] and "already decided" in loser[2]
    again = run_cli("approvals", "approve", "ap", config=cfg)
    assert again.returncode == 1 and "already decided" in again.stderr


@anyio_mark
async def test_library_loser_gets_conflict(make_config: Any, ws: Path) -> None:
    """orch.deny after orch.approve raises CONFLICT naming the winner's status; the call runs once."""
    config = host(make_config, ws, "tools: {approvals: {require: [write], timeout_s: 30}}")
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:main")
        results: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await sess.call("write", {"path": "once.txt", "content": "x"}))

            tg.start_soon(run)
            [waiting] = await pending(orch)
            orch.approve(waiting.id)
            with pytest.raises(SandboxError) as lost:
                orch.deny(waiting.id, "too late")
    assert lost.value.code == ErrorCode.CONFLICT and "already decided (approved)" in lost.value.message
    assert results[0].ok and (ws / "once.txt").exists()


# -- 11: loop detection where the calls of a session meet ---------------------------------------

LOOPS = (
    "tools: {loop_detection: {enabled: true, window: 10, warn_threshold: 2, critical_threshold: 3, "
    "global_circuit_breaker: 5}}"
)


@pytest.mark.slow
def test_loop_detection_trips_across_cli_processes(tmp_path: Path, ws: Path) -> None:
    """The same call from separate `sandbox call` processes warns, then is BLOCKED: the history is in the journal."""
    (ws / "f.txt").write_text("same\n")
    cfg = host_config_file(tmp_path, ws, LOOPS)
    outcomes = []
    for _ in range(3):  # one process each: nothing but the journal carries the history
        r = run_cli("call", "--session", "agent:a:main", "read", '{"path": "f.txt"}', config=cfg, process=True)
        body = json.loads(r.stdout)
        outcomes.append("warn" if body["ok"] and body["warnings"] else "ok" if body["ok"] else body["error"]["code"])
    assert outcomes == ["ok", "warn", "BLOCKED"]
    other = run_cli("call", "--session", "agent:a:other", "read", '{"path": "f.txt"}', config=cfg)
    assert json.loads(other.stdout)["ok"]  # another session has its own history


@anyio_mark
async def test_loop_breaker_and_reset_are_shared_by_orchestrators(make_config: Any, ws: Path) -> None:
    """A breaker tripped in one orchestrator holds in another on the same journal; a reset in either clears it."""
    config = host(make_config, ws, LOOPS)
    async with Orchestrator(config) as first, Orchestrator(config) as second:
        a, b = first.session("agent:a:main"), second.session("agent:a:main")
        for i in range(5):
            await (a if i % 2 else b).call("exec", {"command": "echo same"})
        tripped = await b.call("read", {"path": "anything"})
        assert tripped.error.code == "BLOCKED" and "circuit breaker" in tripped.error.message
        await a.reset_loops()
        assert (await b.call("exec", {"command": "echo fresh"})).ok


@pytest.mark.slow
def test_loop_history_query_is_indexed_and_bounded(tmp_path: Path) -> None:
    """The history query searches the (tenant, session, id) index and reads at most the window."""
    journal = Journal(tmp_path / JOURNAL)
    for i in range(3000):
        journal.loop_add("t", f"s{i % 3}", "exec", f"{i:016x}", "r")
    plan = journal._db.execute(
        "EXPLAIN QUERY PLAN SELECT tool, args, result FROM loop_calls WHERE tenant = ? AND session = ? "
        "AND id > ? ORDER BY id DESC LIMIT ?",
        ("t", "s1", 0, 10),
    ).fetchall()
    began = time.perf_counter()
    tripped, history = journal.loop_recent("t", "s1", 10)
    took = time.perf_counter() - began
    journal.close()
    assert any("loop_calls_session" in str(row) for row in plan) and not any("TEMP B-TREE" in str(r) for r in plan)
    assert not tripped and len(history) == 10 and history[-1][1] == f"{2998:016x}"
    assert took < 0.05


# -- 19: every call the engine refuses or skips is journaled ------------------------------------


@anyio_mark
async def test_batch_skips_and_refusals_are_journaled_with_trace_ids(make_config: Any, ws: Path) -> None:
    """A call blocked by a failed dependency, or whose arguments function fails, is journaled with its reason."""
    async with Orchestrator(host(make_config, ws)) as orch:
        sess = orch.session("agent:a:main")
        result = await sess.call_many(
            [
                BatchCall("read", {"path": "missing.txt"}, id="bad"),
                BatchCall("write", {"path": "after.txt", "content": "x"}, id="after", depends_on=("bad",)),
                BatchCall("write", lambda done: {"path": done["nope"].output}, id="broken"),
            ],
            mode="sequential",
        )
        journal = orch.journal
        assert journal is not None
        blocked, broken = result.results[1], result.results[2]
        assert blocked.error.code == "BLOCKED" and blocked.trace_id and "bad" in blocked.error.message
        assert broken.error.code == "INVALID_ARGUMENTS" and broken.trace_id
        assert stages(journal, blocked.call_id) == ["proposed", "blocked"]
        assert journal.events(call_id=blocked.call_id)[-1].data["message"] == blocked.error.message
        assert journal.events(trace_id=blocked.trace_id)
        assert stages(journal, broken.call_id) == ["proposed", "invalid"]
    assert result.status == "FAILURE" and not (ws / "after.txt").exists()


@pytest.mark.parametrize(
    ("calls", "mode", "message"),
    [
        (
            [BatchCall("read", {"path": "a"}, id="a", depends_on=("b",)), BatchCall("read", {"path": "b"}, id="b")],
            "sequential",
            "does not come before it",
        ),
        ([BatchCall("read", {}, id="a", depends_on=("a",))], "sequential", "cycle"),
        ([BatchCall("read", {}, id="a", depends_on=("zz",))], "parallel", "unknown call"),
        ([BatchCall("read", {}, id="a"), BatchCall("read", {}, id="a")], "parallel", "unique"),
        ([BatchCall("read", {}, id="a")], "sideways", "unknown batch mode"),
        (["read"], "parallel", "not a BatchCall"),
    ],
)
@pytest.mark.slow
@anyio_mark
async def test_bad_batch_specs_are_invalid_arguments_and_journaled(
    make_config: Any, ws: Path, calls: list[Any], mode: str, message: str
) -> None:
    """A bad batch (forward dependency in sequence, unknown id, bad mode...) is INVALID_ARGUMENTS, never a raw error."""
    async with Orchestrator(host(make_config, ws)) as orch:
        with pytest.raises(SandboxError, match=message) as refused:
            await orch.session("agent:a:main").call_many(calls, mode=mode)  # type: ignore[arg-type]
        journal = orch.journal
        assert journal is not None
        invalid = [e for e in journal.events(session="agent:a:main") if e.stage == "invalid"]
    assert refused.value.code == ErrorCode.INVALID_ARGUMENTS
    assert len(invalid) == len(calls) and all(e.trace_id for e in invalid)


# -- 20: --provider, --model and --sender on the CLI ------------------------------------------


@pytest.mark.slow
def test_cli_provider_model_and_sender_apply(tmp_path: Path, ws: Path) -> None:
    """`call`/`exec --provider` meets by_provider layers, `--model` provider/model keys, `--sender` by_sender approvals."""
    cfg = host_config_file(
        tmp_path,
        ws,
        "tools: {by_provider: {acme: {deny: [exec]}, 'other/big': {deny: [read]}},"
        " approvals: {by_sender: {mallory: [write]}, timeout_s: 0.3}}",
    )
    (ws / "f.txt").write_text("x")
    base = ("call", "--session", "agent:a:main")
    plain = run_cli(*base, "exec", '{"command": "true"}', config=cfg)
    acme = run_cli(*base, "--provider", "acme", "exec", '{"command": "true"}', config=cfg)
    assert plain.returncode == 0 and acme.returncode == 1, acme.stdout
    assert json.loads(acme.stdout)["error"]["code"] == "TOOL_NOT_FOUND"
    exec_acme = run_cli("exec", "--session", "agent:a:main", "--provider", "acme", "--", "true", config=cfg)
    assert exec_acme.returncode == 1 and "TOOL_NOT_FOUND" in exec_acme.stderr
    big = run_cli(*base, "--provider", "other", "--model", "big", "read", '{"path": "f.txt"}', config=cfg)
    small = run_cli(*base, "--provider", "other", "--model", "small", "read", '{"path": "f.txt"}', config=cfg)
    assert json.loads(big.stdout)["error"]["code"] == "TOOL_NOT_FOUND" and small.returncode == 0
    mallory = run_cli(*base, "--sender", "mallory", "write", '{"path": "m.txt", "content": "x"}', config=cfg)
    assert json.loads(mallory.stdout)["error"]["code"] == "APPROVAL_TIMEOUT" and not (ws / "m.txt").exists()
    alice = run_cli(*base, "--sender", "alice", "write", '{"path": "a.txt", "content": "x"}', config=cfg)
    assert alice.returncode == 0 and (ws / "a.txt").exists()
