"""`sandbox journal prune`: apply `journal.retention` now (the service also does, periodically)."""

from __future__ import annotations

import click

from sandbox.cli import State, _emit, handled, json_option, main
from sandbox.errors import UsageError


@main.group("journal")
def journal_group() -> None:
    """The journal of calls in the state dir: keep it bounded."""


@journal_group.command("prune")
@click.option("--max-age", help="Keep this much history (30d, 12h, 2w; 0: no bound). Default: journal.retention.")
@click.option("--max-bytes", help="Keep the file under this size (2g, 500m, 2GiB; 0: no bound). Default: as above.")
@click.option(
    "--vacuum",
    is_flag=True,
    help="Also rewrite a journal made before retention existed, once, so that its file shrinks "
    "(blocks the service's writes while it runs: seconds per 100 MB).",
)
@json_option
@click.pass_obj
@handled
def journal_prune(state: State, max_age: str | None, max_bytes: str | None, vacuum: bool, as_json: bool) -> None:
    """Delete events past journal.retention (oldest first, never an open call's or a pending approval's)."""
    # here, not at the top: `sandbox --help` stays cheap
    from pydantic import ValidationError

    from sandbox.config.models import RetentionConfig
    from sandbox.journal.retention import Retention
    from sandbox.journal.store import Journal

    bounds = state.config.journal.retention.model_dump()
    for key, value in (("max_age", max_age), ("max_bytes", max_bytes)):
        if value is not None:
            bounds[key] = value
    try:
        retention = Retention.of(RetentionConfig.model_validate(bounds))
    except ValidationError as exc:
        problems = "; ".join(
            f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}" for e in exc.errors()
        )
        raise UsageError(problems) from None
    journal = Journal(state.config.state_dir / "journal.sqlite3")
    try:
        report = journal.prune(retention, vacuum=vacuum)
    finally:
        journal.close()
    text = (
        f"deleted {report.events_deleted:,} events, {report.approvals_deleted:,} decided approvals, "
        f"{report.loop_rows_deleted:,} loop-detection rows in {report.seconds:.1f} s; kept the events of "
        f"{report.kept_open} open call(s) and every pending approval\n"
        f"{journal.path}: {_mb(report.bytes_before)} -> {_mb(report.bytes_after)}"
    )
    if report.auto_vacuum != "incremental":
        text += (
            "\nthis journal predates retention: its free pages are reused, but the file only shrinks after "
            "`sandbox journal prune --vacuum` (once)"
        )
    _emit(report.__dict__, as_json, text)


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:,.1f} MiB"
