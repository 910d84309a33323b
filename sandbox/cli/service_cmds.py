"""Service commands: `serve` (HTTP) and tenant tokens."""

from __future__ import annotations

from typing import Any

import anyio
import click

from sandbox.cli import State, _emit, handled, json_option, main
from sandbox.errors import UsageError


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback unless told).")
@click.option("--port", default=8710, show_default=True, type=int)
@click.option(
    "--grace",
    default=30,
    show_default=True,
    type=click.IntRange(1, 3600),
    help="On SIGTERM, seconds calls in flight get to finish; then they are stopped (their commands killed).",
)
@click.pass_obj
@handled
def serve(state: State, host: str, port: int, grace: int) -> None:
    """Serve the HTTP API (tenants authenticate with bearer tokens; see docs/service.md)."""
    try:
        # here, and the service's extra (fastapi, uvicorn) may be missing: said plainly
        from sandbox.api import serving
        from sandbox.api.app import create_app
    except ImportError as exc:
        raise UsageError(
            f"the service needs its extra: pip install 'agent-sandbox[service]' ({exc.name} missing)"
        ) from exc
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.api.token_file import read_tokens
    from sandbox.journal.store import check_journal
    from sandbox.state.admin import check_store

    if not state.config.tenants:
        raise UsageError("the service needs tenants with tokens in the config (tenants: [...]); see docs/service.md")
    read_tokens(state.config.state_dir, strict=True)  # a damaged token file stops the start, said plainly
    check_journal(state.config.state_dir / "journal.sqlite3")  # so does a damaged journal (no traceback)
    # and a shared store that cannot be reached, refuses the login or has another schema version
    anyio.run(check_store, state.config.state.parsed(), state.config.state_dir)
    app = create_app(state.config, auditor=_auditor(state.config))
    serving.run(app, host=host, port=port, grace_s=grace)


def _auditor(config: Any) -> Any:
    """What the console's sandboxes page shows of the audit (sandbox/audit/run.py): its findings
    and mount rows per container; the audit reads the Docker engine, so other backends have none."""
    if config.runtime.backend != "docker":
        return None

    def audit() -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        import dataclasses

        import docker

        from sandbox.audit.run import run_audit

        client = docker.from_env()
        try:
            result = run_audit(config, client)
        finally:
            client.close()
        return [dataclasses.asdict(f) for f in result.findings], result.mounts

    return audit


@main.group("tenants")
def tenants_group() -> None:
    """Tenants of the service: tokens."""


@tenants_group.group("token")
def token_group() -> None:
    """Bearer tokens (only their SHA-256 is stored)."""


@token_group.command("create")
@click.argument("tenant")
@click.option("--name", default="default", show_default=True, help="A name for the token (to tell them apart).")
@json_option
@click.pass_obj
@handled
def token_create(state: State, tenant: str, name: str, as_json: bool) -> None:
    """Make a token for TENANT: printed once, only its hash is written (state dir, 0600)."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.api.tenants import create_token, token_hash

    token = create_token(state.config, tenant, name)
    _emit(
        {"tenant": tenant, "name": name, "token": token, "sha256": token_hash(token)},
        as_json,
        f"{token}\n(shown once; its sha256 {token_hash(token)} is kept in "
        f"{'the shared store' if state.config.state.parsed().kind == 'postgresql' else 'the state dir'}; "
        "or put it under tenants[].tokens in the config)",
    )


@token_group.command("revoke")
@click.argument("tenant")
@click.option("--name", default="default", show_default=True, help="The token's name.")
@json_option
@click.pass_obj
@handled
def token_revoke(state: State, tenant: str, name: str, as_json: bool) -> None:
    """Remove TENANT's stored token NAME: every service on this store refuses it from its next request."""
    from sandbox.api.tenants import revoke_token

    revoke_token(state.config, tenant, name)
    _emit({"tenant": tenant, "name": name, "revoked": True}, as_json, f"revoked {tenant}/{name}")


@token_group.command("list")
@json_option
@click.pass_obj
@handled
def token_list(state: State, as_json: bool) -> None:
    """The stored tokens (tenant, name, the start of the hash); never a token itself."""
    from sandbox.api.tenants import stored_tokens

    found = [
        {"tenant": t["tenant"], "name": t.get("name", ""), "sha256": t["sha256"], "where": t["where"]}
        for t in stored_tokens(state.config)
    ]
    lines = [f"{t['tenant']}\t{t['name']}\t{t['sha256'][:12]}...\t{t['where']}" for t in found] or ["no stored tokens"]
    _emit(found, as_json, "\n".join(lines))


@main.command("mcp")
@click.option("--agent", help="The agent whose tools are served (default: the config's default agent).")
@click.option("--session", help="The session key (default: agent:<agent>:mcp).")
@click.pass_obj
@handled
def mcp_cmd(state: State, agent: str | None, session: str | None) -> None:
    """Serve one agent's tools over MCP on stdin/stdout (for desktop clients)."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.config.merge import default_agent_id
    from sandbox.engine.orchestrator import Orchestrator
    from sandbox.policy.sessions import check_session_key

    try:
        # here, and the service's extra (mcp) may be missing: said plainly
        from sandbox.api.mcp_server import serve_stdio
    except ImportError as exc:
        raise UsageError(
            f"MCP needs the service extra: pip install 'agent-sandbox[service]' ({exc.name} missing)"
        ) from exc

    agent_id = agent or default_agent_id(state.config)
    key = check_session_key(session or f"agent:{agent_id}:mcp")

    async def go() -> None:
        async with Orchestrator(state.config, registry=state.registry()) as orch:
            await serve_stdio(orch, orch.session(key, agent=agent_id))

    anyio.run(go)
