"""Lifecycle commands: images build, list, recreate, prune, doctor."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import click

from sandbox import __version__
from sandbox.cli import State, _emit, handled, json_option, main
from sandbox.errors import UsageError

if TYPE_CHECKING:  # imported where used: the CLI starts without docker
    from sandbox.runtime import lifecycle
    from sandbox.runtime.docker.backend import DockerBackend
    from sandbox.runtime.manager import SandboxManager


# an image build streams its steps' output through the control client, and a step may be
# silent for minutes (a layer export): builds wait longer than control calls for an answer
BUILD_TIMEOUT_S = 900.0


def _docker(timeout_s: float | None = None) -> DockerBackend:
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.runtime.docker.backend import CONTROL_TIMEOUT_S, DockerBackend

    return DockerBackend(timeout_s=timeout_s or CONTROL_TIMEOUT_S)


def _targets(state: State) -> list[Any]:
    """images/sandbox, images/browser and images/egress, tagged as the default agent config names them."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.runtime.docker.images import ImageTarget

    sandbox = state.config.agents.defaults.sandbox
    return [
        ImageTarget("sandbox", sandbox.docker.image),
        ImageTarget("browser", sandbox.browser.image),
        ImageTarget("egress", sandbox.egress.image),
    ]


def _manager(state: State) -> SandboxManager:
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.runtime.manager import SandboxManager

    return SandboxManager(state.config, _docker())


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


@main.group("images")
def images_group() -> None:
    """Build the sandbox images (no registry needed)."""


@images_group.command("build")
@click.option("--offline", is_flag=True, help="Never try to pull the base image; debootstrap it.")
@click.option("--force", is_flag=True, help="Rebuild even when up to date.")
@json_option
@click.pass_obj
@handled
def images_build(state: State, offline: bool, force: bool, as_json: bool) -> None:
    """Build the exec and browser images from images/ (idempotent)."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.runtime.docker.images import build_all

    backend = _docker(BUILD_TIMEOUT_S)

    def log(line: str) -> None:
        click.echo(line, err=as_json)

    try:
        built = build_all(backend.client, _targets(state), log, offline=offline, force=force)
    finally:
        backend.client.close()
    if as_json:
        _emit(built, True, "")


@main.command("list")
@json_option
@click.pass_obj
@handled
def list_cmd(state: State, as_json: bool) -> None:
    """This orchestrator's sandboxes: agent, role (pool member, spawned child), scope key, age,
    idle time, config match, state."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.runtime import lifecycle

    async def go() -> list[lifecycle.SandboxRow]:
        manager = _manager(state)
        try:
            return await lifecycle.rows(manager)
        finally:
            await manager.backend.aclose()

    found = anyio.run(go)
    data: list[dict[str, Any]] = [
        {
            "name": r.info.name,
            "id": r.info.id[:12],
            "kind": r.info.kind,
            "agent": r.info.agent,
            "tenant": r.info.tenant,
            "scope": r.info.scope,
            "scope_key": r.info.scope_key,
            "age_s": round(r.age_s),
            "idle_s": round(r.idle_s),
            "config_match": r.config_match,
            "role": r.role,
            "status": r.info.status,
        }
        for r in found
    ]
    lines = [f"{'NAME':<44} {'AGENT':<10} {'ROLE':<6} {'SCOPE KEY':<28} {'AGE':>6} {'IDLE':>6} {'CONFIG':<7} STATE"]
    for d in data:
        # a free pool member matches its pool's config; a child's sandbox, the child's own view
        match = {True: "match", False: "STALE", None: "?"}[d["config_match"]]
        lines.append(
            f"{d['name']:<44} {d['agent']:<10} {d['role'] or '-':<6} {d['scope_key'][:28]:<28} "
            f"{_age(d['age_s']):>6} {_age(d['idle_s']):>6} {match:<7} {d['status']}"
        )
    if not data:
        lines = ["no sandboxes"]
    _emit(data, as_json, "\n".join(lines))


@main.command()
@click.option("--all", "all_", is_flag=True, help="Every sandbox of this orchestrator.")
@click.option("--agent", help="The sandboxes of one agent.")
@click.option("--session", help="The sandbox of one session (or scope key).")
@click.option("--browser", is_flag=True, help="Browser sandboxes instead of exec sandboxes.")
@json_option
@click.pass_obj
@handled
def recreate(state: State, all_: bool, agent: str | None, session: str | None, browser: bool, as_json: bool) -> None:
    """Remove sandboxes so they are created afresh (with the current config) on next use."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.policy.sessions import check_session_key
    from sandbox.runtime import lifecycle

    if sum(bool(x) for x in (all_, agent, session)) != 1:
        raise UsageError("choose exactly one of --all, --agent ID, --session KEY")
    if session is not None:
        check_session_key(session)  # a key that only looks like another once trimmed selects nothing

    async def go() -> list[str]:
        manager = _manager(state)
        try:
            return await lifecycle.recreate(manager, all_=all_, agent=agent, session=session, browser=browser)
        finally:
            await manager.backend.aclose()

    removed = anyio.run(go)
    _emit(
        {"removed": removed},
        as_json,
        "\n".join(f"removed {n}" for n in removed) or "nothing matched",
    )


@main.command()
@click.option("--dry-run", is_flag=True, help="Show what would be removed.")
@json_option
@click.pass_obj
@handled
def prune(state: State, dry_run: bool, as_json: bool) -> None:
    """Remove sandboxes idle past prune.idle_hours or older than prune.max_age_days (0 disables)."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.fs import locks
    from sandbox.runtime import lifecycle

    async def go() -> tuple[list[tuple[str, str]], list[str], int]:
        manager = _manager(state)
        try:
            orphans = [] if dry_run else await manager.cleanup_orphans()
            pruned = await lifecycle.prune(manager, dry_run=dry_run)
        finally:
            await manager.backend.aclose()
        # file locks nobody holds (a process that died holding one; versions that kept them)
        lock_files = (
            0 if dry_run else await anyio.to_thread.run_sync(locks.sweep, locks.lock_dir(state.config.state_dir))
        )
        return pruned, orphans, lock_files

    pruned, orphans, lock_files = anyio.run(go)
    verb = "would remove" if dry_run else "removed"
    lines = [f"{verb} {name}: {why}" for name, why in pruned] + [f"removed half-created {n}" for n in orphans]
    if lock_files:
        lines.append(f"removed {lock_files} leftover file lock(s)")
    _emit(
        {
            "pruned": [{"name": n, "reason": r} for n, r in pruned],
            "orphans": orphans,
            "lock_files_removed": lock_files,
            "dry_run": dry_run,
        },
        as_json,
        "\n".join(lines) or "nothing to prune",
    )


@main.command()
@json_option
@click.pass_obj
@handled
def doctor(state: State, as_json: bool) -> None:
    """Check the engine, runtimes, images, cgroup limits and the state dir (on Kubernetes: the
    API, the namespaces' Pod Security labels, what this identity may do, the classes named)."""
    if state.config.runtime.backend == "kubernetes":
        # the cluster's checks only where a cluster runs the sandboxes
        from sandbox.runtime.kubernetes.doctor import run_checks as cluster_checks

        _report([*anyio.run(cluster_checks, state.config), _state_check(state)], as_json)
        return
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.runtime.checks import Check
    from sandbox.runtime.docker.doctor import journal_check, run_checks, workspace_checks

    backend = _docker()
    try:
        client = backend.client
    except Exception as exc:
        checks = [
            Check("fail", "engine", str(exc), "start the Docker engine (dockerd) or set DOCKER_HOST"),
            *workspace_checks(state.config),
            journal_check(state.config),
        ]
    else:
        try:
            checks = run_checks(client, state.config, _targets(state))
        finally:
            client.close()  # its connection pool holds the engine's socket open otherwise
    _report([*checks, _state_check(state)], as_json)


def _state_check(state: State) -> Any:
    """The state store (state.url): reachable, its schema this code's."""
    from sandbox.runtime.checks import Check
    from sandbox.state.admin import doctor_verdict

    verdict, detail, fix = anyio.run(doctor_verdict, state.config.state.parsed(), state.config.state_dir)
    return Check(verdict, "state store", detail, fix)


def _report(checks: list[Any], as_json: bool) -> None:
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    text = "\n".join(
        f"[{marks[c.status]}] {c.name:<16} {c.detail}" + (f"\n       fix: {c.fix}" if c.fix else "") for c in checks
    )
    _emit([c.__dict__ for c in checks], as_json, text)
    if any(c.status == "fail" for c in checks):
        sys.exit(1)


@main.group("audit", invoke_without_command=True)
@click.option("--all-containers", is_flag=True, help="Audit every container on the engine, not only ours.")
@click.option(
    "--fail-on",
    type=click.Choice(["critical", "high", "medium", "low", "info"]),
    default="high",
    show_default=True,
    help="Exit 1 when a finding is at or above this severity.",
)
@click.option("--sarif", is_flag=True, help="Print SARIF 2.1.0.")
@click.option("--no-engine", is_flag=True, help="Audit the config only.")
@json_option
@click.pass_context
@handled
def audit(ctx: click.Context, all_containers: bool, fail_on: str, sarif: bool, no_engine: bool, as_json: bool) -> None:
    """What every sandbox can reach, checked against CIS Docker 5.x and Pod Security rules."""
    if ctx.invoked_subcommand is not None:
        return
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.audit.findings import at_or_above
    from sandbox.audit.report import to_json, to_sarif, to_text
    from sandbox.audit.run import run_audit

    state: State = ctx.obj
    client = None if no_engine else _docker().client
    try:
        result = run_audit(state.config, client, all_containers=all_containers)
    finally:
        if client is not None:
            client.close()
    if sarif:
        click.echo(json.dumps(to_sarif(result.findings, __version__), indent=2))
    else:
        _emit(to_json(result.findings, result.mounts), as_json, to_text(result.findings, result.mounts))
    sys.exit(1 if at_or_above(result.findings, fail_on) else 0)


@audit.command("mounts")
@json_option
@click.pass_obj
@handled
def audit_mounts(state: State, as_json: bool) -> None:
    """Every host path each agent's sandboxes can read or write, the mode, and the config key."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.audit.run import mount_map

    table = mount_map(state.config)
    lines = []
    for target, rows in table.items():
        lines.append(f"== {target}")
        lines += [f"   {r['host']:<52} -> {r['container']:<18} {r['mode']:<3}  from {r['from']}" for r in rows]
    _emit(table, as_json, "\n".join(lines))
