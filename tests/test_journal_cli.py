"""The journal from the command line: `logs` reads one page, `journal prune`, a damaged journal, `doctor`'s check."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from sandbox.config import load_config
from sandbox.journal.store import Journal
from sandbox.runtime.docker.doctor import journal_check
from tests.cli_helpers import run_cli


def setup(tmp_path: Path, extra: str = "") -> tuple[Path, Journal]:
    state = tmp_path / "state"
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {state}\n{extra}")
    return config, Journal(state / "journal.sqlite3")


def put(journal: Journal, n: int, tenant: str = "acme", data: dict[str, str] | None = None) -> None:
    for i in range(n):
        journal.append(
            trace_id="t", call_id=f"{tenant}-{i}", session="agent:a:s", tenant=tenant, agent="a", tool="exec",
            stage="finished", data=data,
        )  # fmt: skip


def ids(stdout: str) -> list[int]:
    return [json.loads(line)["id"] for line in stdout.splitlines() if line.strip()]


def damage(path: Path) -> None:
    """Every page but the first two overwritten: the schema still reads, the rows do not."""
    data = bytearray(path.read_bytes())
    for offset in range(2 * 4096, len(data), 4096):
        data[offset : offset + 4096] = b"\xa5" * 4096
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("limit", ["-5", "0", "10001"])
def test_a_limit_outside_one_to_ten_thousand_is_a_usage_error(tmp_path: Path, limit: str) -> None:
    """`logs --limit -5` (and 0, and past the page maximum) exits 2 with a message, printing no events."""
    config, journal = setup(tmp_path)
    put(journal, 20)
    journal.close()
    result = run_cli("logs", "--limit", limit, "--json", config=config)
    assert result.returncode == 2, result.stdout
    assert "limit" in result.stderr and result.stdout == ""


def test_logs_prints_the_newest_page_and_the_cursor_walks_back(tmp_path: Path) -> None:
    """Of 250 events `--limit 100` prints the newest 100 (oldest first); the printed cursor gives the 100 before."""
    config, journal = setup(tmp_path)
    put(journal, 250)
    journal.close()
    first = run_cli("logs", "--limit", "100", "--json", config=config)
    assert first.returncode == 0, first.stderr
    assert ids(first.stdout) == list(range(151, 251))
    cursor = first.stderr.split("--cursor ")[1].split(")")[0]
    second = run_cli("logs", "--limit", "100", "--cursor", cursor, "--json", config=config)
    assert ids(second.stdout) == list(range(51, 151))
    bad = run_cli("logs", "--cursor", "e1 OR 1=1", config=config)
    assert bad.returncode == 2 and "bad cursor" in bad.stderr


@pytest.mark.slow
def test_logs_tenant_and_time_filters_are_in_the_query(tmp_path: Path) -> None:
    """`--tenant quiet` shows its 3 events beside 1000 of a neighbour; --since in the future shows none."""
    config, journal = setup(tmp_path)
    put(journal, 3, tenant="quiet")
    put(journal, 1000, tenant="busy")
    journal.close()
    quiet = run_cli("logs", "--limit", "100", "--tenant", "quiet", "--json", config=config)
    assert [json.loads(line)["tenant"] for line in quiet.stdout.splitlines()] == ["quiet"] * 3
    assert run_cli("logs", "--since", "2999-01-01T00:00", config=config).stdout == ""
    assert len(ids(run_cli("logs", "--since", "1h", "--limit", "5", "--json", config=config).stdout)) == 5
    bad = run_cli("logs", "--since", "yesterday-ish", config=config)
    assert bad.returncode == 2 and "--since" in bad.stderr


@pytest.mark.slow
def test_journal_prune_applies_the_bounds_given(tmp_path: Path) -> None:
    """`sandbox journal prune --max-bytes` shrinks the journal under the bound and says what it deleted."""
    config, journal = setup(tmp_path)
    put(journal, 600, data={"output": "x" * 1500})
    journal.close()
    result = run_cli("journal", "prune", "--max-bytes", "256k", "--json", config=config)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["events_deleted"] > 0 and report["bytes_after"] <= 256 * 1024
    refused = run_cli("journal", "prune", "--max-age", "a while", config=config)
    assert refused.returncode == 2 and "--max-age" in refused.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", [("status",), ("logs",), ("journal", "prune")])
def test_a_damaged_journal_is_a_clear_error_without_a_traceback(tmp_path: Path, command: tuple[str, ...]) -> None:
    """status, logs and prune on a journal whose pages are garbage: exit 1, the file and the fix named, no traceback."""
    config, journal = setup(tmp_path)
    put(journal, 300, data={"output": "y" * 200})
    journal.close()
    damage(journal.path)
    result = run_cli(*command, config=config)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert str(journal.path) in result.stderr and "aside" in result.stderr


@pytest.mark.slow
def test_a_file_that_is_not_a_database_stops_serve_plainly(tmp_path: Path) -> None:
    """`sandbox serve` over a journal that is not a database exits 1 with the file and the fix, no traceback."""
    sha = "0" * 64
    config, journal = setup(
        tmp_path,
        f"tenants: [{{id: acme, allow_unsandboxed: true, tokens: [{{name: a, sha256: '{sha}'}}]}}]\n"
        "agents: {defaults: {sandbox: {mode: 'off'}}, list: [{id: a, tenant: acme}]}\n",
    )
    journal.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{journal.path}{suffix}").unlink(missing_ok=True)
    journal.path.write_bytes(b"not a database " * 500)
    result = run_cli("serve", "--port", "1", config=config, process=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and str(journal.path) in result.stderr


def test_doctor_checks_the_journal_in_full(tmp_path: Path) -> None:
    """doctor's journal check: ok on a sound journal, fail naming the damage, warn for one made before retention."""
    config_path, journal = setup(tmp_path)
    put(journal, 300, data={"output": "y" * 200})
    journal.close()
    config = load_config(config_path)
    ok = journal_check(config)
    assert ok.status == "ok" and "integrity ok" in ok.detail
    damage(journal.path)
    failed = journal_check(config)
    assert failed.status == "fail" and failed.fix
    for suffix in ("", "-wal", "-shm"):
        Path(f"{journal.path}{suffix}").unlink(missing_ok=True)
    db = sqlite3.connect(journal.path)  # made before retention: auto_vacuum NONE
    db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, trace_id TEXT NOT NULL, "
               "call_id TEXT NOT NULL, session TEXT NOT NULL, tenant TEXT NOT NULL, agent TEXT NOT NULL, "
               "tool TEXT NOT NULL, stage TEXT NOT NULL, duration_ms REAL, data TEXT NOT NULL DEFAULT '{}')")  # fmt: skip
    db.close()
    old = journal_check(config)
    assert old.status == "warn" and "--vacuum" in old.fix
