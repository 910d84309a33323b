"""Idempotency keys in the library (`session.call(..., idempotency_key=...)`, engine/once.py): a
keyed call runs once, however often and however concurrently it is asked for, and a repeat gets
the first call's result, across a restart too. Commands run on the host (sandbox mode off): what
is tested is the once, counted by a file each run appends to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Orchestrator
from sandbox.config import load_config_text
from sandbox.errors import ConfigError

pytestmark = pytest.mark.anyio
COUNT = "echo ran >> count.txt; wc -l < count.txt"


def _config(tmp_path: Path, extra: str = "") -> Any:
    ws, ws_b = tmp_path / "ws", tmp_path / "ws-b"
    ws.mkdir(exist_ok=True)
    ws_b.mkdir(exist_ok=True)
    return load_config_text(
        f"state_dir: '{tmp_path / 'state'}'\n"
        "tenants: [{id: acme}, {id: other}]\n"
        "agents: {defaults: {sandbox: {mode: 'off'}}, list: ["
        f"{{id: a, tenant: acme, workspace: '{ws}'}}, {{id: b, tenant: other, workspace: '{ws_b}'}}]}}\n{extra}",
        base_dir=tmp_path,
    )


def _runs(tmp_path: Path) -> int:
    path = tmp_path / "ws" / "count.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_a_repeat_returns_the_first_result_and_runs_nothing(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:s1")
        first = await session.call("exec", {"command": COUNT}, idempotency_key="deploy-42")
        again = await session.call("exec", {"command": COUNT}, idempotency_key="deploy-42")
        fresh = await session.call("exec", {"command": COUNT}, idempotency_key="deploy-43")
        assert first.ok and again.ok and fresh.ok, (first.error, again.error)
        assert again.output == first.output and again.call_id == first.call_id
        assert any("not a new run" in w for w in again.warnings)
        assert fresh.output["output"].strip() == "2"
        assert orch.journal is not None
        assert {e.call_id for e in orch.journal.events(session=session.key)} == {first.call_id, fresh.call_id}
    assert _runs(tmp_path) == 2


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_twenty_concurrent_repeats_of_one_key_run_once(tmp_path: Path) -> None:
    results: list[Any] = []
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:s2")

        async def one() -> None:
            results.append(await session.call("exec", {"command": f"sleep 0.3; {COUNT}"}, idempotency_key="k-20"))

        async with anyio.create_task_group() as group:
            for _ in range(20):
                group.start_soon(one)
    assert _runs(tmp_path) == 1
    assert len(results) == 20 and all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert {r.output["output"].strip() for r in results} == {"1"} and len({r.call_id for r in results}) == 1


async def test_the_same_key_for_another_call_is_refused_naming_the_key(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:s3")
        assert (await session.call("exec", {"command": COUNT}, idempotency_key="k-x")).ok
        other_args = await session.call("exec", {"command": "echo other"}, idempotency_key="k-x")
        other_session = await orch.session(agent="a", key="agent:a:s4").call(
            "exec", {"command": COUNT}, idempotency_key="k-x"
        )
        for refused in (other_args, other_session):
            assert not refused.ok and refused.error.code == "INVALID_ARGUMENTS"
            assert "'k-x'" in refused.error.message and "another call" in refused.error.message
        # another tenant's key of the same name is its own: it runs
        theirs = await orch.session(agent="b", key="agent:b:s1").call("exec", {"command": COUNT}, idempotency_key="k-x")
        assert theirs.ok and theirs.output["output"].strip() == "1"
    assert _runs(tmp_path) == 1


@pytest.mark.parametrize("key", ["", "x" * 201, "has space", "tab\there", "ünïcode"])
async def test_a_malformed_key_is_refused_and_nothing_runs(tmp_path: Path, key: str) -> None:
    async with Orchestrator(_config(tmp_path)) as orch:
        refused = await orch.session(agent="a", key="agent:a:s5").call("exec", {"command": COUNT}, idempotency_key=key)
    assert not refused.ok and refused.error.code == "INVALID_ARGUMENTS" and "idempotency key" in refused.error.message
    assert _runs(tmp_path) == 0


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_an_expired_key_runs_a_new_call(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path, "journal: {idempotency_ttl: 1s}")) as orch:
        session = orch.session(agent="a", key="agent:a:s6")
        first = await session.call("exec", {"command": COUNT}, idempotency_key="k-ttl")
        await anyio.sleep(1.2)
        later = await session.call("exec", {"command": COUNT}, idempotency_key="k-ttl")
    assert first.ok and later.ok and later.call_id != first.call_id
    assert _runs(tmp_path) == 2


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_cancelled_first_call_makes_its_key_a_conflict_not_a_second_run(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:s7")
        with anyio.move_on_after(0.5):
            await session.call("exec", {"command": f"{COUNT}; sleep 30"}, idempotency_key="k-cut")
        repeat = await session.call("exec", {"command": f"{COUNT}; sleep 30"}, idempotency_key="k-cut")
    assert not repeat.ok and repeat.error.code == "CONFLICT"
    assert "abandoned" in repeat.error.message and "a new key runs it again" in repeat.error.message
    assert _runs(tmp_path) == 1


async def test_a_repeat_after_a_restart_gets_the_recorded_result(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with Orchestrator(config) as orch:
        first = await orch.session(agent="a", key="agent:a:s8").call("exec", {"command": COUNT}, idempotency_key="k-r")
    async with Orchestrator(config) as orch:
        again = await orch.session(agent="a", key="agent:a:s8").call("exec", {"command": COUNT}, idempotency_key="k-r")
    assert first.ok and again.ok and again.output == first.output
    assert _runs(tmp_path) == 1


def test_keys_must_expire(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"journal\.idempotency_ttl"):
        _config(tmp_path, "journal: {idempotency_ttl: 0}")


async def test_without_a_journal_a_key_is_refused(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path), journal=False) as orch:
        refused = await orch.session(agent="a", key="agent:a:s9").call(
            "exec", {"command": COUNT}, idempotency_key="k-nj"
        )
    assert not refused.ok and "journal" in refused.error.message
    assert _runs(tmp_path) == 0


async def test_a_keyed_batch_repeated_runs_nothing_again(tmp_path: Path) -> None:
    """Each call of a batch runs once under `key#n`; a repeat gets the same results."""
    from sandbox.engine.batch import BatchCall
    from sandbox.errors import SandboxError

    batch = [BatchCall("exec", {"command": COUNT}, "one"), BatchCall("exec", {"command": COUNT}, "two", ("one",))]
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:b1")
        first = await session.call_many(batch, idempotency_key="batch-1")
        again = await session.call_many(batch, idempotency_key="batch-1")
        assert first.status == again.status == "SUCCESS"
        assert [r.call_id for r in again.results] == [r.call_id for r in first.results]
        assert [r.output["output"].strip() for r in again.results] == ["1", "2"]
        with pytest.raises(SandboxError, match="1 to 190 characters"):
            await session.call_many(batch, idempotency_key="x" * 191)
    assert _runs(tmp_path) == 2


async def test_a_repeat_of_a_key_whose_process_died_is_a_conflict_not_a_long_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record left `running` by a process that died before its call's first stage (no open
    call in the journal): a repeat ends it as abandoned and answers CONFLICT, never a second run."""
    import dataclasses
    import time as clock

    from sandbox.engine.once import fingerprint
    from sandbox.journal.calls import CallRecord, JournalCalls

    monkeypatch.setattr(JournalCalls, "GONE_CHECK_S", 0.0)
    async with Orchestrator(_config(tmp_path)) as orch:
        session = orch.session(agent="a", key="agent:a:dead")
        store = orch.call_store
        assert store is not None
        orphan = CallRecord(
            call_id="c_orphan", tenant="acme", session=session.key, agent="a", tool="exec",
            idempotency_key="k-dead", fingerprint=fingerprint("exec", {"command": COUNT}, "a", session.key),
            state="running", result=None, reason="", created=clock.time() - 100, ended=None,
        )  # fmt: skip
        assert (await store.claim_call(dataclasses.replace(orphan), keep_s=3600)).call_id == "c_orphan"
        with anyio.fail_after(10):
            repeat = await session.call("exec", {"command": COUNT}, idempotency_key="k-dead")
    assert not repeat.ok and repeat.error.code == "CONFLICT" and "went away" in repeat.error.message
    assert _runs(tmp_path) == 0


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_a_key_never_expires_while_its_call_runs(tmp_path: Path) -> None:
    """A call longer than the key's lifetime: a repeat during it waits for it, it does not run it
    again (the lifetime counts from the end of the call)."""
    results: list[Any] = []
    async with Orchestrator(_config(tmp_path, "journal: {idempotency_ttl: 1s}")) as orch:
        session = orch.session(agent="a", key="agent:a:long")

        async def first() -> None:
            results.append(await session.call("exec", {"command": f"{COUNT}; sleep 2.5"}, idempotency_key="k-long"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await anyio.sleep(1.5)  # past the key's 1 s lifetime, the first call still runs
            results.append(await session.call("exec", {"command": f"{COUNT}; sleep 2.5"}, idempotency_key="k-long"))
    assert _runs(tmp_path) == 1
    assert len({r.call_id for r in results}) == 1 and all(r.ok for r in results)


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
async def test_the_end_of_a_call_is_recorded_through_a_short_store_outage(tmp_path: Path) -> None:
    """The store fails the first two attempts to record a call's end (an outage): the end is
    retried and lands, so a repeat gets the result instead of waiting on a `running` record."""
    from sandbox.errors import ErrorCode, SandboxError

    async with Orchestrator(_config(tmp_path)) as orch:
        store = orch.call_store
        assert store is not None
        failures = [2]
        real_end = store.end_call

        async def flaky_end(*args: Any, **kwargs: Any) -> None:
            if failures[0]:
                failures[0] -= 1
                raise SandboxError(ErrorCode.SERVICE_UNAVAILABLE, "the store is down for a moment")
            await real_end(*args, **kwargs)

        store.end_call = flaky_end  # type: ignore[method-assign]
        session = orch.session(agent="a", key="agent:a:outage")
        first = await session.call("exec", {"command": COUNT}, idempotency_key="k-out")
        again = await session.call("exec", {"command": COUNT}, idempotency_key="k-out")
    assert failures == [0] and first.ok and again.call_id == first.call_id
    assert _runs(tmp_path) == 1
