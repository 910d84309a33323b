"""sandbox.testing: the fake backend and log capture users put under their own tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.errors import SandboxUnavailable
from sandbox.testing import FakeBackend, FakeCall, capture_logs, exec_result

pytestmark = pytest.mark.anyio

SANDBOXED = "agents: {defaults: {sandbox: {mode: all, scope: session, workspace_access: none}}}"


async def test_fake_backend_answers_exec_and_records_the_call(make_config: Any) -> None:
    """exec goes to the handler; the call, its environment tag and workdir are recorded."""
    seen: list[FakeCall] = []

    def handler(call: FakeCall) -> Any:
        seen.append(call)
        return exec_result(stdout=b"hello\n")

    backend = FakeBackend(handler)
    async with Orchestrator(make_config(SANDBOXED), backend=backend) as orch:
        result = await orch.session("agent:main:t").call("exec", {"command": "echo hello"})
    assert result.ok and result.output["output"] == "hello\n" and result.output["exit_code"] == 0
    assert [c.command for c in backend.calls] == ["echo hello"] == [c.command for c in seen]
    assert backend.calls[0].workdir == "/workspace"


async def test_file_tools_work_on_a_real_workspace_under_the_fake(make_config: Any) -> None:
    """write then read round-trips through the real scratch workspace the fake made."""
    backend = FakeBackend()
    async with Orchestrator(make_config(SANDBOXED), backend=backend) as orch:
        sess = orch.session("agent:main:files")
        assert (await sess.call("write", {"path": "a.txt", "content": "one\n"})).ok
        read = await sess.call("read", {"path": "a.txt"})
        [box] = backend.sandboxes.values()
    assert read.ok and "one" in read.output["content"]
    assert (Path(box.spec.mounts[0].source) / "a.txt").read_text() == "one\n"


async def test_a_handler_fault_becomes_a_tool_result(make_config: Any) -> None:
    """A SandboxError raised by the handler reaches the model as a coded ToolResult, not an exception."""

    def handler(call: FakeCall) -> Any:
        raise SandboxUnavailable("engine went away")

    async with Orchestrator(make_config(SANDBOXED), backend=FakeBackend(handler)) as orch:
        result = await orch.session("agent:main:fault").call("exec", {"command": "true"})
    assert (
        not result.ok and result.error is not None and result.error.code in ("SANDBOX_UNAVAILABLE", "RETRY_EXHAUSTED")
    )


async def test_capture_logs_collects_events_with_fields(make_config: Any) -> None:
    """capture_logs returns the library's events with their bound fields, then the library is quiet again."""
    async with Orchestrator(make_config(SANDBOXED), backend=FakeBackend()) as orch:
        with capture_logs() as logs:
            await orch.session("agent:main:logs").call("exec", {"command": "true"})
        await orch.session("agent:main:logs").call("exec", {"command": "true"})
    events = [r["event"] for r in logs]
    assert "tool_call_finished" in events
    finished = next(r for r in logs if r["event"] == "tool_call_finished")
    assert finished["tool"] == "exec" and "duration_ms" in finished
    assert events.count("tool_call_finished") == 1  # nothing captured after the block


async def test_host_backend_by_name_runs_tools_without_docker(make_config: Any, monkeypatch: Any) -> None:
    """runtime.backend: host runs a sandboxed session's tools on the host, in its scratch workspace."""
    import sys

    monkeypatch.setitem(sys.modules, "docker", None)  # no Docker SDK at all: the host backend must not need it
    config = make_config("runtime: {backend: host}\n" + SANDBOXED)
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:main:h")
        assert (await sess.call("write", {"path": "f.txt", "content": "x\n"})).ok
        ran = await sess.call("exec", {"command": "cat f.txt; pwd", "workdir": "."})
        assert orch.backend.name == "host"
    assert ran.ok and ran.output["output"].startswith("x\n") and ran.output["exit_code"] == 0


async def test_missing_backend_dependency_names_what_to_install(make_config: Any, monkeypatch: Any) -> None:
    """runtime.backend: docker without the docker SDK is SANDBOX_UNAVAILABLE naming the package."""
    import sys

    monkeypatch.setitem(sys.modules, "docker", None)
    monkeypatch.delitem(sys.modules, "sandbox.runtime.docker.backend", raising=False)
    async with Orchestrator(make_config(SANDBOXED)) as orch:
        result = await orch.session("agent:main:nodocker").call("exec", {"command": "true"})
    assert result.error is not None and result.error.code in ("SANDBOX_UNAVAILABLE", "RETRY_EXHAUSTED")
    assert "pip install" in result.error.message or "pip install" in str(result.error.details)
