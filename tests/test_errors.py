"""One error root: every error raised on purpose is a SandboxError, with a code, an exit code and
an HTTP status from one table; nothing foreign escapes the public API."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox import ConfigError, ErrorCode, Orchestrator, SandboxError, UsageError, load_config, load_config_text
from sandbox.errors import _STATUS, USAGE_EXIT_CODE, BindRefused, SandboxUnavailable, exit_code_for
from tests.cli_helpers import run_cli


def test_every_error_class_has_one_root() -> None:
    """Config, usage, engine and bind errors are all SandboxErrors (one `except` catches them)."""
    for cls in (ConfigError, UsageError, SandboxUnavailable, BindRefused):
        assert issubclass(cls, SandboxError)
    assert {"ConfigError", "ErrorCode", "SandboxError", "UsageError"} <= set(sandbox.__all__)


def test_usage_family_is_invalid_arguments_and_exits_2() -> None:
    """ConfigError and UsageError carry INVALID_ARGUMENTS (HTTP 422) and the usage exit code 2."""
    config = ConfigError(["c.yaml:1:1: a problem", "c.yaml:2:1: another"])
    usage = UsageError("unknown agent 'x'", agent="x")
    assert config.code == usage.code == ErrorCode.INVALID_ARGUMENTS
    assert config.exit_code == usage.exit_code == USAGE_EXIT_CODE == 2
    assert config.http_status == usage.http_status == 422
    assert config.message == str(config) == "c.yaml:1:1: a problem\nc.yaml:2:1: another"
    assert config.details == {"problems": config.problems} and usage.details == {"agent": "x"}
    assert not config.retryable and str(usage) == usage.message == "unknown agent 'x'"


def test_every_code_has_an_exit_code_and_a_status() -> None:
    """The one table covers every code; an error's exit code and status come from it."""
    assert set(_STATUS) == set(ErrorCode)
    error = SandboxError(ErrorCode.SANDBOX_UNAVAILABLE, "no engine")
    assert error.exit_code == exit_code_for(ErrorCode.SANDBOX_UNAVAILABLE) == 3 and error.http_status == 503


def raises_only_sandbox_errors(fn: Callable[[], Any]) -> SandboxError | None:
    """Run fn; a foreign exception fails the test (pytest reports it), a SandboxError is returned."""
    try:
        fn()
    except SandboxError as exc:
        return exc
    return None


@pytest.mark.parametrize(
    "text",
    [
        "a: [1, 2",  # not YAML
        "- 1\n- 2\n",  # not a mapping
        "limits: {global_concurrency: many}",  # wrong type
        "no_such_key: 1",  # unknown key
        "a: &x [*x]",  # a recursive alias
        "\x00",  # not text YAML accepts
    ],
)
def test_bad_config_text_is_a_config_error(text: str, tmp_path: Path) -> None:
    """Config text that cannot load raises ConfigError, never a parser's or pydantic's exception."""
    error = raises_only_sandbox_errors(lambda: load_config_text(text, source="c.yaml", base_dir=tmp_path))
    assert isinstance(error, ConfigError) and error.problems


def test_unreadable_config_files_are_config_errors(tmp_path: Path) -> None:
    """A missing file and a directory given as the config file are ConfigErrors."""
    for path in (tmp_path / "missing.yaml", tmp_path):
        assert isinstance(raises_only_sandbox_errors(partial(load_config, path)), ConfigError)


def test_bad_sessions_are_usage_errors(make_config: Any) -> None:
    """An unknown agent, a malformed key and a key of another agent raise UsageError."""
    orch = Orchestrator(make_config(), journal=False)
    bad: list[Callable[[], Any]] = [
        lambda: orch.session("s1", agent="nobody"),
        lambda: orch.session("agent:main:a/b"),
        lambda: orch.session(" main"),
        lambda: orch.session("agent:main:s1", agent="other"),
    ]
    for attempt in bad:
        assert isinstance(raises_only_sandbox_errors(attempt), UsageError)


@pytest.mark.anyio
async def test_bad_calls_come_back_as_results(make_config: Any, tmp_path: Path) -> None:
    """An unknown tool, a name that is no string and arguments that are no JSON are results, not raises."""
    ws = tmp_path / "ws"
    ws.mkdir()
    config = make_config(f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: a, workspace: '{ws}'}}]}}")
    async with Orchestrator(config, journal=False) as orch:
        session = orch.session("agent:a:main")
        unknown = await session.call("no_such_tool", {})
        not_a_name = await session.call(42, {})  # type: ignore[arg-type]
        not_json = await session.call("read", {"path": object()})
    assert unknown.error is not None and unknown.error.code == "TOOL_NOT_FOUND"
    assert not_a_name.error is not None and not_a_name.error.code == "TOOL_NOT_FOUND"
    assert not_json.error is not None and not_json.error.code == "INVALID_ARGUMENTS"


def test_cli_exits_2_for_config_and_usage_errors(tmp_path: Path) -> None:
    """The CLI prints a config error's problems, or a usage error's message, and exits 2 (no traceback)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("limits: {global_concurrency: many}\n")
    config_run = run_cli("explain", "--session", "s1", config=bad)
    assert config_run.returncode == 2 and config_run.stderr.startswith("config error:")
    assert "global_concurrency" in config_run.stderr and "Traceback" not in config_run.stderr
    usage_run = run_cli("explain", "--agent", "nobody", "--session", "s1")
    assert usage_run.returncode == 2 and usage_run.stderr.startswith("error: unknown agent 'nobody'")


def _raised_from(cause: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise outer from exc
    except BaseException as caught:
        return caught


def test_a_full_disk_is_retryable_and_nothing_else_changes_code() -> None:
    """A call's failure that comes from a full disk (ENOSPC, EDQUOT, SQLite's SQLITE_FULL, however
    deep in the chain) is SERVICE_UNAVAILABLE and retryable; any other foreign exception is
    INTERNAL; a deliberate code (a full workspace disk is QUOTA_EXCEEDED) is kept."""
    import errno
    import sqlite3

    from sandbox.errors import StateError, out_of_space, unavailable_when_full

    db = sqlite3.connect(":memory:")
    try:
        db.execute("PRAGMA max_page_count = 2")
        db.execute("CREATE TABLE t (x)")
        with pytest.raises(sqlite3.Error) as full_db:
            db.execute("INSERT INTO t VALUES (zeroblob(100000))")
    finally:
        db.close()
    journal = _raised_from(full_db.value, SandboxError(ErrorCode.INTERNAL, "the journal cannot be written"))
    for failure in (
        journal,
        OSError(errno.ENOSPC, "No space left on device"),
        _raised_from(OSError(errno.EDQUOT, "Disk quota exceeded"), RuntimeError("wrapped")),
    ):
        assert out_of_space(failure)
        mapped = unavailable_when_full(failure)
        assert mapped.code == ErrorCode.SERVICE_UNAVAILABLE and mapped.retryable and "disk is full" in mapped.message
    quota = SandboxError(ErrorCode.QUOTA_EXCEEDED, "no space left on the device that holds the workspace")
    assert unavailable_when_full(_raised_from(OSError(errno.ENOSPC, "full"), quota)).code == ErrorCode.QUOTA_EXCEEDED
    closed = _raised_from(
        sqlite3.ProgrammingError("Cannot operate on a closed database."), SandboxError(ErrorCode.INTERNAL, "x")
    )
    assert not out_of_space(closed) and unavailable_when_full(closed).code == ErrorCode.INTERNAL
    assert unavailable_when_full(ValueError("bug")).code == ErrorCode.INTERNAL
    assert issubclass(StateError, SandboxError)


def test_a_call_the_journal_could_not_record_never_shows_the_tenant_its_files() -> None:
    """The journal's own reason names the database under the state dir; the caller gets a fixed
    text (a full disk stays retryable, any deliberate code stays as it was)."""
    import errno

    from sandbox.errors import NOT_RECORDED, unrecorded

    damaged = SandboxError(
        ErrorCode.INTERNAL, "the journal at /var/lib/agent-sandbox/journal.sqlite3 cannot be written (disk I/O error)"
    )
    shown = unrecorded(damaged)
    assert shown.code == ErrorCode.INTERNAL and shown.message == NOT_RECORDED and "/var/lib" not in shown.message
    full = _raised_from(OSError(errno.ENOSPC, "No space left on device"), damaged)
    assert isinstance(full, SandboxError) and unrecorded(full).code == ErrorCode.SERVICE_UNAVAILABLE
    refused = SandboxError(ErrorCode.PERMISSION_DENIED, "a hook refused it")
    assert unrecorded(refused) is refused
