"""`sandbox state migrate|status`: the state store's schema (docs/state.md)."""

from __future__ import annotations

import click

from sandbox.cli import State, _emit, handled, json_option, main


@main.group("state")
def state_group() -> None:
    """The state store (state.url: SQLite in state_dir, or PostgreSQL shared by replicas)."""


@state_group.command("migrate")
@click.option("--to", "target", type=click.IntRange(min=0), help="Stop at this schema version. Default: the latest.")
@json_option
@click.pass_obj
@handled
def state_migrate(state: State, target: int | None, as_json: bool) -> None:
    """Bring the store's schema up to this code's version (forward only; a newer store is refused)."""
    # here, not at the top: `sandbox --help` stays cheap
    import anyio

    from sandbox.state.admin import migrate_store

    url = state.config.state.parsed()
    report = anyio.run(migrate_store, url, state.config.state_dir, target)
    if report.applied:
        text = f"{url.kind} store: schema {report.before} -> {report.after} ({', '.join(report.applied)})"
    else:
        text = f"{url.kind} store: schema {report.after}, nothing to do"
    _emit({"kind": url.kind, **report.__dict__}, as_json, text)


@state_group.command("status")
@json_option
@click.pass_obj
@handled
def state_status(state: State, as_json: bool) -> None:
    """The store's kind, where it is and its schema version against this code's."""
    import anyio

    from sandbox.state.admin import store_status

    status = anyio.run(store_status, state.config.state.parsed(), state.config.state_dir)
    verdict = (
        "current"
        if status.version == status.code_version
        else ("newer than this code" if status.version > status.code_version else "run `sandbox state migrate`")
    )
    text = (
        f"{status.kind} store at {status.where}: schema {status.version} (this code: {status.code_version}; {verdict})"
    )
    _emit(status.__dict__, as_json, text)
