"""The state store's schema: `sandbox state migrate` from an empty database and from the previous
version with data in it, a database newer than the code refused, and every failure to reach the
store a clear message (never a traceback)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import psycopg
import pytest

from sandbox.config.state import parse_state_url
from sandbox.errors import ErrorCode, SandboxError
from sandbox.state import QuotaLimits, Reservation, open_store
from sandbox.state.admin import migrate_store, store_status
from sandbox.state.migrate import head, steps
from sandbox.state.sqlite.schema import statements
from sandbox.state.sqlite.store import FILE_NAME
from tests.cli_helpers import run_cli
from tests.pg_server import PgServer

LATEST = len(steps("postgresql"))  # this code's schema version (the same steps for both dialects)


def names_after(version: int) -> tuple[str, ...]:
    """The steps a database at `version` is given to reach this code's schema."""
    return tuple(f"{s.version:04d}_{s.name}" for s in steps("postgresql") if s.version > version)


pytestmark = pytest.mark.anyio

FAR_LEASE = time.time() + 3600


def test_both_dialects_have_the_same_steps() -> None:
    """SQLite and PostgreSQL histories have the same numbered steps, at least two (a real upgrade path)."""
    pg = [(s.version, s.name) for s in steps("postgresql")]
    lite = [(s.version, s.name) for s in steps("sqlite")]
    assert pg == lite and len(pg) >= 2 and head("postgresql") == len(pg)


def test_sqlite_steps_split_into_statements() -> None:
    """A step runs statement by statement (executescript would commit halfway)."""
    for step in steps("sqlite"):
        parts = statements(step.sql)
        assert parts and all(sqlite3.complete_statement(p) for p in parts)


def _config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "sandbox.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\nstate:\n  url: '{url}'\n")
    return path


# --- PostgreSQL ------------------------------------------------------------------------------


@pytest.mark.postgres
async def test_pg_from_empty_to_head(pg_url: str, tmp_path: Path) -> None:
    """An empty database is brought to this code's version; a second run has nothing to do."""
    url = parse_state_url(pg_url)
    first = await migrate_store(url, tmp_path)
    assert (first.before, first.after) == (0, head("postgresql"))
    assert first.applied == names_after(0)
    assert first.applied[:8] == (
        "0001_quotas",
        "0002_approvals",
        "0003_calls",
        "0004_call_durable",
        "0005_events",
        "0006_tokens",
        "0007_session_uids",
        "0008_pool_claims",
    )
    again = await migrate_store(url, tmp_path)
    assert (again.before, again.after, again.applied) == (head("postgresql"),) * 2 + ((),)
    status = await store_status(url, tmp_path)
    assert (status.version, status.code_version) == (head("postgresql"), head("postgresql"))
    assert "@" in status.where and ":***@" in status.where  # the password is masked


@pytest.mark.postgres
async def test_pg_from_the_previous_version_keeps_its_data(pg_url: str, tmp_path: Path) -> None:
    """A database at version 1 holding a live reservation is upgraded; the reservation still counts."""
    url = parse_state_url(pg_url)
    report = await migrate_store(url, tmp_path, target=1)
    assert (report.before, report.after) == (0, 1)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO owners VALUES ('old@elsewhere|b|1|1', %s)", (FAR_LEASE,))
        conn.execute("INSERT INTO reservations VALUES ('q-old', 't1', 'old@elsewhere|b|1|1', 1, %s)", (time.time(),))
        assert conn.execute("SELECT to_regclass('approvals')").fetchone() == (None,)
    with pytest.raises(SandboxError) as behind:  # the store refuses the old schema until migrated
        async with open_store(url, tmp_path):
            pass
    assert behind.value.code == ErrorCode.SERVICE_UNAVAILABLE and "schema version 1" in behind.value.message
    upgraded = await migrate_store(url, tmp_path)
    assert (upgraded.before, upgraded.after, upgraded.applied) == (1, LATEST, names_after(1))
    async with open_store(url, tmp_path, owner="new@elsewhere|b|1|1") as store:
        assert await store.in_flight("t1") == 1
        refused = await store.reserve("t1", QuotaLimits(max_concurrent_calls=1))
        assert not isinstance(refused, Reservation)
        assert await store.approvals() == []


@pytest.mark.postgres
async def test_pg_from_the_last_release_keeps_its_running_calls(pg_url: str, tmp_path: Path) -> None:
    """The previous release's schema (4) with a running durable call: upgraded, the call is there
    with its durable note (still adoptable), and the shared events' and tokens' tables are new
    and empty."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path, target=4)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO calls (call_id, tenant, session, agent, tool, idem_key, fingerprint, state, created, owner, "
            "durable) VALUES ('c_old', 't1', 's', 'a', 'exec', 'k', 'f', 'running', %s, 'old|b|1|1', '{\"pid\": 7}')",
            (time.time(),),
        )
        assert conn.execute("SELECT to_regclass('sbx_events')").fetchone() == (None,)
    upgraded = await migrate_store(url, tmp_path)
    assert (upgraded.before, upgraded.after, upgraded.applied) == (4, LATEST, names_after(4))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT state, durable FROM calls WHERE call_id = 'c_old'").fetchone()
        assert row == ("running", '{"pid": 7}')
        assert conn.execute("SELECT count(*) FROM sbx_events").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM sbx_tokens").fetchone() == (0,)


@pytest.mark.postgres
async def test_pg_newer_than_the_code_is_refused(pg_url: str, tmp_path: Path) -> None:
    """A database a newer release migrated is neither migrated nor opened; the message says both versions."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sbx_schema VALUES (99, 'future', now()::text)")
    with pytest.raises(SandboxError) as migrated:
        await migrate_store(url, tmp_path)
    assert f"schema version 99, newer than this code's {LATEST}" in migrated.value.message
    assert (await store_status(url, tmp_path)).version == 99
    with pytest.raises(SandboxError) as opened:
        async with open_store(url, tmp_path):
            pass
    assert "newer than this code's" in opened.value.message


@pytest.mark.postgres
async def test_pg_two_migrations_at_once_apply_each_step_once(pg_url: str, tmp_path: Path) -> None:
    """Two replicas migrating at the same moment: one applies the steps, the other finds them done."""
    url = parse_state_url(pg_url)
    reports = []

    async def run() -> None:
        reports.append(await migrate_store(url, tmp_path))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        tg.start_soon(run)
    assert sorted(len(r.applied) for r in reports) == [0, LATEST]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM sbx_schema").fetchone() == (LATEST,)


@pytest.mark.postgres
async def test_pg_an_unmigrated_database_is_refused_with_the_fix(pg_url: str, tmp_path: Path) -> None:
    """Opening a database with no schema says to run `sandbox state migrate`."""
    with pytest.raises(SandboxError) as info:
        async with open_store(parse_state_url(pg_url), tmp_path):
            pass
    assert info.value.code == ErrorCode.SERVICE_UNAVAILABLE
    assert "has no schema yet" in info.value.message and "sandbox state migrate" in info.value.message


@pytest.mark.postgres
async def test_pg_a_target_behind_the_database_is_refused(pg_url: str, tmp_path: Path) -> None:
    """Steps only go forward: --to 1 on a database at 2 is an error, nothing changes."""
    url = parse_state_url(pg_url)
    await migrate_store(url, tmp_path)
    with pytest.raises(SandboxError, match="steps only go forward"):
        await migrate_store(url, tmp_path, target=1)


@pytest.mark.postgres
def test_cli_migrate_and_status(pg_url: str, tmp_path: Path) -> None:
    """`sandbox state migrate --to 1`, `status`, then `migrate`: the versions as said, exit 0."""
    config = _config(tmp_path, pg_url)
    first = run_cli("state", "migrate", "--to", "1", config=config)
    assert first.returncode == 0, first.stderr
    assert "schema 0 -> 1 (0001_quotas)" in first.stdout
    status = run_cli("state", "status", config=config)
    assert f"schema 1 (this code: {LATEST}; run `sandbox state migrate`)" in status.stdout
    second = run_cli("state", "migrate", "--json", config=config)
    assert second.returncode == 0 and f'"after": {LATEST}' in second.stdout
    assert "password" not in status.stdout and pg_url.split(":")[2].split("@")[0] not in status.stdout


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("refused", "Connection refused"),
        ("password", "password authentication failed"),
        ("database", 'database "absent" does not exist'),
    ],
)
def test_cli_unusable_server_is_a_clear_error(pg_server: PgServer, tmp_path: Path, case: str, expected: str) -> None:
    """Unreachable, bad credentials or no such database: one line naming the store, exit 1, no traceback."""
    import socket

    url = {
        "password": pg_server.url("postgres", password="wrong-password"),
        "database": pg_server.url("absent"),
    }.get(case)
    if url is None:
        with socket.socket() as s:  # a loopback port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"postgresql://sbx:pw@127.0.0.1:{port}/db"
    result = run_cli("state", "migrate", config=_config(tmp_path, url), process=True)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error [SERVICE_UNAVAILABLE]: the state store at postgresql://")
    assert expected in result.stderr
    assert "wrong-password" not in result.stderr


# --- SQLite ----------------------------------------------------------------------------------


async def test_sqlite_from_empty_and_from_the_previous_version(tmp_path: Path) -> None:
    """The SQLite store migrates itself on open, from nothing or from version 1 with its data."""
    url = parse_state_url("sqlite:")
    report = await migrate_store(url, tmp_path, target=1)
    assert (report.before, report.after) == (0, 1)
    db = sqlite3.connect(tmp_path / FILE_NAME)
    db.execute("INSERT INTO owners VALUES ('old@elsewhere|b|1|1', ?)", (FAR_LEASE,))
    db.execute("INSERT INTO reservations VALUES ('q-old', 't1', 'old@elsewhere|b|1|1', 1, ?)", (time.time(),))
    db.commit()
    db.close()
    async with open_store(url, tmp_path, owner="new@elsewhere|b|1|1") as store:  # embedded: migrates on open
        assert await store.in_flight("t1") == 1
        assert await store.approvals() == []
    assert (await store_status(url, tmp_path)).version == head("sqlite")
    assert (tmp_path / FILE_NAME).stat().st_mode & 0o777 == 0o600


async def test_sqlite_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    """A state file a newer release wrote is not opened."""
    url = parse_state_url("sqlite:")
    await migrate_store(url, tmp_path)
    db = sqlite3.connect(tmp_path / FILE_NAME)
    db.execute("INSERT INTO sbx_schema VALUES (99, 'future', 'x')")
    db.commit()
    db.close()
    with pytest.raises(SandboxError) as info:
        async with open_store(url, tmp_path):
            pass
    assert f"schema version 99, newer than this code's {LATEST}" in info.value.message


def test_cli_sqlite_status_before_and_after(tmp_path: Path) -> None:
    """Without state.url the CLI speaks of the SQLite file in state_dir."""
    config = tmp_path / "sandbox.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    before = run_cli("state", "status", config=config)
    assert before.returncode == 0 and f"schema 0 (this code: {LATEST}" in before.stdout
    assert run_cli("state", "migrate", config=config).returncode == 0
    after = run_cli("state", "status", config=config)
    assert (
        f"sqlite store at {tmp_path / 'state' / FILE_NAME}: schema {LATEST} (this code: {LATEST}; current)"
        in after.stdout
    )


@pytest.mark.postgres
async def test_doctor_says_where_the_store_stands(pg_url: str, pg_server: PgServer, tmp_path: Path) -> None:
    """doctor's line: fail with `sandbox state migrate` before, ok after, fail naming the store when it refuses us."""
    from sandbox.state.admin import doctor_verdict

    url = parse_state_url(pg_url)
    before = await doctor_verdict(url, tmp_path)
    assert before[0] == "fail" and before[2] == "sandbox state migrate"
    await migrate_store(url, tmp_path)
    assert (await doctor_verdict(url, tmp_path))[:2] == (
        "ok",
        f"postgresql store at {url.shown}: schema {LATEST} (current)",
    )
    refused = await doctor_verdict(parse_state_url(pg_server.url("postgres", password="nope")), tmp_path)
    assert refused[0] == "fail" and "password authentication failed" in refused[1] and "nope" not in refused[1]
    lite = await doctor_verdict(parse_state_url("sqlite:"), tmp_path)
    assert lite[0] == "ok" and "migrated on first use" in lite[1]
