"""Tool-call commands: call (JSON in, ToolResult out), exec (for people), demo."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import click

from sandbox.cli import State, handled, json_option, main
from sandbox.errors import SandboxError, UsageError
from sandbox.escape import escape, escape_json

if TYPE_CHECKING:  # imported where used: the CLI starts without the engine
    from sandbox.engine.progress import ProgressEvent
    from sandbox.tools.spec import ToolResult

F = TypeVar("F", bound=Callable[..., Any])


class Spinner:
    """Shows `⠋ exec 2.1s` on a terminal's stderr for calls that take longer than a second."""

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self._frame = 0
        self._shown = False

    def __call__(self, event: ProgressEvent) -> None:
        if not self.enabled:
            return
        if event.kind == "running" and event.elapsed_s >= 1.0:
            self._frame = (self._frame + 1) % len(self.FRAMES)
            sys.stderr.write(f"\r{self.FRAMES[self._frame]} {escape(event.tool)} {event.elapsed_s:.1f}s ")
            sys.stderr.flush()
            self._shown = True
        elif event.kind == "finished" and self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


@dataclass(frozen=True)
class Caller:
    """Who makes a CLI call: the model's provider/model (`tools.by_provider` layers) and the
    sender (`tools.approvals.by_sender`), as a chat front end passes them to `orch.session`."""

    provider: str | None = None
    model: str | None = None
    sender: str | None = None


def caller_options(fn: F) -> F:
    """Add --provider, --model and --sender to a command."""
    fn = click.option("--sender", help="Who sent the request (tools.approvals.by_sender).")(fn)
    fn = click.option("--model", help="Model id, e.g. gpt-4o (tools.by_provider `provider/model`).")(fn)
    return click.option("--provider", help="Model provider, e.g. openai (tools.by_provider).")(fn)


def _run_call(
    state: State, agent: str | None, session: str, tool: str, arguments: Any, caller: Caller | None = None
) -> ToolResult:
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.config.merge import default_agent_id
    from sandbox.engine.orchestrator import Orchestrator
    from sandbox.engine.progress import ProgressBus
    from sandbox.policy.sessions import agent_of

    who = caller or Caller()

    async def go() -> ToolResult:
        bus = ProgressBus(heartbeat_s=0.2)
        bus.subscribe(Spinner())
        async with Orchestrator(state.config, registry=state.registry(), progress=bus) as orch:
            # calls a killed orchestrator left behind (its commands may still run): settled first
            await orch.recover(adopt=False)  # a one-shot process: durable calls are the service's
            sess = orch.session(
                session,
                agent=agent or agent_of(session) or default_agent_id(state.config),
                provider=who.provider,
                model=who.model,
                sender=who.sender,
            )
            return await sess.call(tool, arguments)

    return anyio.run(go)


@main.command()
@click.option("--agent", help="Agent id (default: from the session key, else the default agent).")
@click.option("--session", required=True, help="Session key.")
@caller_options
@click.argument("tool")
@click.argument("json_args", default="{}")
@json_option
@click.pass_obj
@handled
def call(
    state: State,
    agent: str | None,
    session: str,
    provider: str | None,
    model: str | None,
    sender: str | None,
    tool: str,
    json_args: str,
    as_json: bool,
) -> None:
    """Run one tool call through the policy and the sandbox; print the ToolResult JSON.

    JSON_ARGS `-` reads the arguments from standard input. Exit 0 when the result is ok, 1 when
    it is an error, 2 for usage or config errors (bad JSON included).
    """
    del as_json  # the ToolResult is JSON either way
    arguments = parse_arguments(json_args)
    result = _run_call(state, agent, session, tool, arguments, Caller(provider, model, sender))
    click.echo(escape_json(result.model_dump(mode="json"), indent=2))
    sys.exit(0 if result.ok else 1)


def parse_arguments(json_args: str) -> Any:
    """JSON_ARGS parsed and bounded like the engine bounds them.

    Raises:
        UsageError: not JSON, nested too deep for the parser itself, or over the engine's limits.
    """
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.engine.arguments import MAX_DEPTH, check_arguments

    if json_args == "-":
        json_args = sys.stdin.read()
    try:
        arguments = json.loads(json_args)
    except json.JSONDecodeError as exc:
        raise UsageError(f"JSON_ARGS is not valid JSON: {exc}") from exc
    except RecursionError:
        # the parser recurses per nesting level; tens of thousands of levels overflow it
        raise UsageError(
            f"JSON_ARGS: arguments are nested deeper than {MAX_DEPTH} levels (too deep even to parse)"
        ) from None
    try:
        check_arguments(arguments)
    except SandboxError as exc:
        raise UsageError(f"JSON_ARGS: {exc.message}") from exc
    return arguments


@main.command("exec", context_settings={"ignore_unknown_options": True})
@click.option("--agent")
@click.option("--session", required=True)
@click.option("--timeout", "timeout_s", type=float, help="Seconds before the command is killed.")
@caller_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@json_option
@click.pass_obj
@handled
def exec_cmd(
    state: State,
    agent: str | None,
    session: str,
    timeout_s: float | None,
    provider: str | None,
    model: str | None,
    sender: str | None,
    command: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run a command as the session's exec tool would: `sandbox exec --session K -- ls -la`."""
    # here, not at the top: `sandbox --help` stays cheap
    import shlex

    args: dict[str, Any] = {"command": shlex.join(command) if len(command) > 1 else command[0]}
    if timeout_s:
        args["timeout_s"] = timeout_s
    result = _run_call(state, agent, session, "exec", args, Caller(provider, model, sender))
    # the command's output is the sandbox's text: printed with its control characters escaped
    if as_json:
        click.echo(escape_json(result.model_dump(mode="json"), indent=2))
    elif result.ok:
        click.echo(escape(str(result.output.get("output", "")), multiline=True), nl=False)
    else:
        assert result.error is not None
        if isinstance(result.output, dict):
            click.echo(escape(str(result.output.get("output", "")), multiline=True), nl=False)
        click.echo(f"error [{result.error.code}]: {escape(result.error.message)}", err=True)
    for warning in result.warnings:
        click.echo(f"warning: {escape(warning)}", err=True)
    code = result.output.get("exit_code") if result.ok and isinstance(result.output, dict) else 1
    sys.exit(code if isinstance(code, int) else 1)


@main.command()
@click.option("--agent", help="Agent whose non-main session is driven (default: the default agent).")
@click.option("--keep", is_flag=True, help="Keep the demo session's sandbox afterwards.")
@json_option
@click.pass_obj
@handled
def demo(state: State, agent: str | None, keep: bool, as_json: bool) -> None:
    """A short scripted agent session against real sandboxes, printed as a person would read it."""
    # here, not at the top: `sandbox --help` stays cheap
    from sandbox.cli.demo import run_demo

    ok = anyio.run(run_demo, state.config, agent, keep, as_json)
    sys.exit(0 if ok else 1)
