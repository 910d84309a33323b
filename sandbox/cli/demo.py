"""The README demo: one scripted agent session against real sandboxes with the given policy."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import anyio
import click

from sandbox.cli.demo_subagents import subagents_part
from sandbox.config.merge import default_agent_id
from sandbox.config.models import Config
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.runtime.seccomp import describe_security_opts
from sandbox.tools.display import describe
from sandbox.tools.spec import ToolResult

PATCH = """*** Begin Patch
*** Update File: app/greet.py
@@ def greet(name):
-    return "Hello, " + name
+    return f"Hello, {name}!"
*** Add File: app/test_greet.py
+from greet import greet
+assert greet("sandbox") == "Hello, sandbox!"
+print("test passed")
*** End Patch
"""

# (tool, arguments, expected error code or None for success, what it shows); `app` is replaced
# by a folder of its own for each run, so runs in one agent-scoped workspace never collide.
SCRIPT: list[tuple[str, dict[str, Any], str | None, str]] = [
    (
        "write",
        {"path": "app/greet.py", "content": 'def greet(name):\n    return "Hello, " + name\n'},
        None,
        "create a file (atomic: temp file + rename)",
    ),
    (
        "read",
        {"path": "app/greet.py", "line_numbers": True},
        None,
        "read it back with line numbers",
    ),
    (
        "edit",
        {
            "path": "app/greet.py",
            "old_string": "def greet(name):",
            "new_string": "def greet(name: str) -> str:",
        },
        None,
        "exact-string edit (must match once)",
    ),
    (
        "apply_patch",
        {"input": PATCH.replace("@@ def greet(name):", "@@ def greet(name: str) -> str:")},
        None,
        "multi-file patch, all or nothing",
    ),
    (
        "exec",
        {"command": "cd app && python3 test_greet.py && id && ls -la"},
        None,
        "run the test in the sandbox",
    ),
    (
        "exec",
        {"command": "for i in 1 2 3; do echo step $i; sleep 0.2; done", "background": True},
        None,
        "start a background process",
    ),
    ("read", {"path": "../../etc/passwd"}, "PERMISSION_DENIED", "path traversal is refused"),
    (
        "exec",
        {"command": "ln -sf /etc/passwd app/leak && echo planted"},
        None,
        "the sandbox plants a symlink ...",
    ),
    ("read", {"path": "app/leak"}, "PERMISSION_DENIED", "... which file tools never follow"),
    (
        "exec",
        {"command": "sleep 300 & sleep 300", "timeout_s": 1},
        "TIMEOUT",
        "a timeout kills the whole process group",
    ),
    (
        "exec",
        {"command": "if pgrep -f '^sleep 300$'; then echo LEFT RUNNING; else echo none left; fi"},
        None,
        "... nothing of it is left",
    ),
    (
        "browser",
        {"action": "navigate", "url": "https://example.com"},
        "TOOL_NOT_FOUND",
        "the default sandbox policy has no browser",
    ),
]


def _summary(result: ToolResult) -> str:
    if not result.ok:
        assert result.error is not None
        return f"{result.error.code}: {result.error.message}"
    out = result.output
    if isinstance(out, dict):
        if "content" in out:
            return str(out["content"]).rstrip()
        if "output" in out:
            text = str(out["output"]).rstrip()
            code = out.get("exit_code")
            return (f"exit {code}\n" if code is not None else f"{out.get('status', '')}\n") + text
        return json.dumps(out)
    return str(out)


def _indent(text: str, prefix: str = "     │ ") -> str:
    lines = text.splitlines() or [""]
    if len(lines) > 14:
        lines = [*lines[:12], f"... ({len(lines) - 12} more lines)"]
    return "\n".join(prefix + line for line in lines)


async def _show_sandbox(session: Session, echo: Callable[[str], None]) -> dict[str, Any]:
    box = await session.sandbox_required()
    backend = session._orch.backend
    seen = await backend.facts(box.id)
    if seen is None:
        echo(f"sandbox  {box.id} (runtime.backend {backend.name}: no container to show)")
        return {"container": box.id, "backend": backend.name}
    facts: dict[str, Any] = {
        "container": seen.name,
        "id": seen.id[:12],
        "image": seen.image,
        "user": seen.user,
        "network": seen.network,
        "cap_drop": list(seen.cap_drop),
        "security_opt": describe_security_opts(list(seen.security_opt)),
        "read_only_root": seen.read_only_root,
        "pids_limit": seen.pids_limit,
        "memory": seen.memory,
        "nano_cpus": seen.nano_cpus,
        "init": seen.init,
        "mounts": [f"{m.source} -> {m.target} ({'ro' if m.read_only else 'rw'})" for m in seen.mounts],
    }
    echo("sandbox  " + facts["container"] + f" ({facts['id']}, image {facts['image']})")
    echo(
        f"         user {facts['user']}, network {facts['network']}, cap_drop {facts['cap_drop']}, "
        f"{'read-only root' if facts['read_only_root'] else 'WRITABLE root'}"
    )
    echo(
        f"         {facts['security_opt']}, pids {facts['pids_limit']}, memory {facts['memory'] // 2**20} MiB, "
        f"cpus {facts['nano_cpus'] / 1e9:g}, init {facts['init']}"
    )
    for mount in facts["mounts"]:
        echo(f"         mount {mount}")
    return facts


async def _control_part(
    config: Config, agent_id: str, key: str, echo: Callable[[str], None], report: dict[str, Any]
) -> bool:
    """Approvals and loop detection, switched on for this part (the default policy has neither)."""
    tools = config.tools.model_copy(
        update={
            "approvals": config.tools.approvals.model_copy(update={"require": ["apply_patch"], "timeout_s": 30}),
            "loop_detection": config.tools.loop_detection.model_copy(
                update={"enabled": True, "warn_threshold": 2, "critical_threshold": 3, "global_circuit_breaker": 6}
            ),
        }
    )
    echo("with approvals on apply_patch and loop detection switched on:")
    ok = True
    async with Orchestrator(config.model_copy(update={"tools": tools})) as orch:
        session = orch.session(key + "-control", agent=agent_id)
        name = f"approved-{int(time.time() * 1000)}.txt"
        patch = {"input": f"*** Begin Patch\n*** Add File: {name}\n+a human said yes\n*** End Patch\n"}

        async def human() -> None:
            while not orch.pending_approvals():  # noqa: ASYNC110 - the decision arrives through the journal
                await anyio.sleep(0.05)
            pending = orch.pending_approvals()[0]
            echo(f"     ⏸ waiting for approval {pending.id} (sandbox approvals approve {pending.id})")
            orch.approve(pending.id, "looks fine")
            echo(f"     👤 approved {pending.id}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(human)
            result = await session.call("apply_patch", patch)
        echo(describe("apply_patch", patch))
        echo(f"     {'✓' if result.ok else '✗ UNEXPECTED'} ran after the approval ({result.duration_ms:.0f} ms)")
        ok &= result.ok
        for attempt in range(1, 4):
            args = {"command": "ls"}
            looped = await session.call("exec", args)
            echo(describe("exec", args) + f"   (attempt {attempt})")
            if looped.ok:
                note = f" — note for the model: {looped.warnings[0]}" if looped.warnings else ""
                echo(f"     ✓ ran{note}")
            else:
                assert looped.error is not None
                echo(f"     ✓ stopped: {looped.error.code}: {looped.error.message}")
        ok &= not looped.ok and looped.error is not None and looped.error.code == "BLOCKED"
        report["control"] = {"approval_ok": result.ok, "loop_stopped": not looped.ok}
        echo(f"     (the journal has the whole story: sandbox logs --session {session.key})")
    return ok


async def run_demo(config: Config, agent: str | None, keep: bool, as_json: bool) -> bool:
    """Drive the script; return whether every step did what it should."""
    agent_id = agent or default_agent_id(config)
    key = f"agent:{agent_id}:demo-{int(time.time())}"

    def echo(text: str) -> None:
        click.echo(text, err=as_json)  # with --json, the story goes to stderr and data to stdout

    report: dict[str, Any] = {"session": key, "steps": []}
    all_ok = True
    async with Orchestrator(config) as orch:
        session = orch.session(key, agent=agent_id)
        status = session.policy.sandbox
        echo(f"session  {key}")
        echo(f"policy   {'sandboxed' if status.sandboxed else 'on the host'}: {status.reason}")
        echo(f"tools    {', '.join(t.name for t in session.tools())}")
        echo("")
        folder = f"demo-{int(time.time() * 1000)}"
        for tool, raw_args, expected, note in SCRIPT:
            args = json.loads(json.dumps(raw_args).replace("app/", f"{folder}/").replace("cd app", f"cd {folder}"))
            result = await session.call(tool, args)
            got = None if result.ok else result.error.code if result.error else "?"
            good = got == expected and not (result.ok and "LEFT RUNNING" in json.dumps(result.output))
            all_ok &= good
            mark = "✓" if good else "✗ UNEXPECTED"
            echo(f"{describe(tool, args)}")
            echo(f"     {mark} {note} ({result.duration_ms:.0f} ms)")
            echo(_indent(_summary(result)))
            report["steps"].append(
                {
                    "tool": tool,
                    "expected": expected,
                    "got": got,
                    "ok": good,
                    "duration_ms": result.duration_ms,
                }
            )
            if tool == "exec" and args.get("background") and result.ok:
                await anyio.sleep(1.0)
                proc_args = {"action": "poll", "id": result.output["process_id"]}
                polled = await session.call("process", proc_args)
                echo(describe("process", proc_args))
                echo(f"     {'✓' if polled.ok else '✗'} poll the background process")
                echo(_indent(_summary(polled)))
                all_ok &= polled.ok
        echo("")
        if session.sandboxed:
            report["sandbox"] = await _show_sandbox(session, echo)
            if not keep and session.agent.sandbox.scope == "session":
                await session.close()
                echo("         (session closed: its session-scoped sandbox was removed)")
        echo("")
    all_ok &= await _control_part(config, agent_id, key, echo, report)
    echo("")
    all_ok &= await subagents_part(config, agent_id, key, echo, report)
    echo("")
    echo("demo: every step behaved as expected" if all_ok else "demo: SOME STEPS DID NOT BEHAVE AS EXPECTED")
    if as_json:
        report["ok"] = all_ok
        click.echo(json.dumps(report, indent=2, default=str))
    return all_ok
