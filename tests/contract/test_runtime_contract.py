"""One contract over the runtime protocol, run against every backend that can run here: Docker
(the real engine) and Kubernetes (a fake API whose Pods are real containers,
tests/k8s_fake_cluster.py; scripts/k8s-e2e runs the same file against a real cluster when
KUBECONFIG is set). What a tool may rely on whatever runs it: ensure, exists, list, remove, run,
kill, timeouts, files, a sandbox gone behind the backend's back, a new process adopting."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.config import Config, effective_agent, load_config_text
from sandbox.engine.orchestrator import Orchestrator
from sandbox.runtime.protocol import Backend, RunRequest
from sandbox.runtime.spec import spec_from_config
from tests.conftest import RUN_ID, TEST_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

KINDS = ["docker", "kubernetes"]


@dataclass
class Target:
    """One backend under contract: its config, and how to make a backend for it (a new one
    stands for a new orchestrator process)."""

    kind: str
    config: Config
    new_backend: Callable[[], Backend]
    remove_behind: Callable[[str], Any]  # remove a sandbox without telling the backend


# a skill that reports what its sandbox lets it see and write (test_a_skill_call_gets_only_what_it_declares)
PEEK = """import json, os, pathlib
out = {"listing": sorted(os.listdir("/workspace")), "home": sorted(n for n in os.listdir("/opt/skill") if not n.startswith(".."))}
for name in ("/workspace/secret.txt", "/workspace/public/note.txt", "/workspace/public/up/secret.txt"):
    try:
        out[name] = pathlib.Path(name).read_text()
    except OSError as exc:
        out[name] = type(exc).__name__
try:
    pathlib.Path("/workspace/public/planted.txt").write_text("x")
    out["planted"] = "wrote"
except OSError as exc:
    out["planted"] = type(exc).__name__
print(json.dumps(out))
"""


def _config(tmp_path: Path, kind: str) -> Config:
    peek = tmp_path / "skills" / "peek"
    peek.mkdir(parents=True)
    (peek / "SKILL.md").write_text(
        "---\nname: peek\ndescription: what a skill sees\n"
        "permissions: {filesystem: {read: ['/workspace/public/**']}}\n---\n"
    )
    (peek / "handler.py").write_text(PEEK)
    (tmp_path / "ws-skill").mkdir()
    os.chown(tmp_path / "ws-skill", 1000, 1000)  # Docker's rw workspace: the sandbox user's folder
    return load_config_text(
        f"""
state_dir: {tmp_path / "state"}
instance: {RUN_ID}c{kind[0]}
runtime:
  backend: {kind}
  kubernetes: {{pod_ready_timeout_s: 60, seccomp: "Localhost:agent-sandbox/strict.json"}}
skills: {{dirs: ['{tmp_path / "skills"}']}}
tools: {{also_allow: [peek], sandbox: {{tools: {{also_allow: [peek]}}}}}}
tenants:
  - id: acme
agents:
  defaults:
    sandbox: {{mode: all, scope: session, workspace_access: none, workspace_root: {tmp_path / "scratch"}}}
  list:
    - {{id: main, tenant: acme, default: true, workspace: {tmp_path / "ws"}}}
    - {{id: skilled, tenant: acme, workspace: {tmp_path / "ws-skill"}, sandbox: {{workspace_access: rw}}}}
""",
        base_dir=tmp_path,
    )


@pytest.fixture(params=KINDS)
async def target(request: pytest.FixtureRequest, tmp_path: Path, docker_client: Any) -> AsyncIterator[Target]:
    kind = request.param
    config = _config(tmp_path, kind)
    if kind == "docker":
        from sandbox.runtime.docker.backend import DockerBackend

        def remove_docker(name: str) -> None:
            docker_client.containers.get(name).remove(force=True)

        yield Target(kind, config, DockerBackend, remove_docker)
        return
    if os.environ.get("KUBECONFIG") and os.environ.get("SANDBOX_K8S_E2E"):  # scripts/k8s-e2e: a real cluster
        import subprocess

        import yaml

        from sandbox.runtime.kubernetes.backend import KubernetesBackend
        from sandbox.runtime.kubernetes.names import namespace_for
        from sandbox.runtime.kubernetes.tenant import Orchestrator as OrchestratorAccount
        from sandbox.runtime.kubernetes.tenant import tenant_objects

        objects = yaml.safe_dump_all(tenant_objects(config, config.tenants[0], OrchestratorAccount()))
        subprocess.run(["kubectl", "apply", "-f", "-"], input=objects, text=True, check=True, timeout=120)
        namespace = namespace_for(config.runtime.kubernetes, "acme")

        def delete_pod(name: str) -> None:
            subprocess.run(["kubectl", "-n", namespace, "delete", "pod", name, "--grace-period=0"], check=True)

        yield Target(kind, config, lambda: KubernetesBackend(config), delete_pod)
        return
    from sandbox.runtime.kubernetes.backend import KubernetesBackend
    from sandbox.runtime.kubernetes.names import namespace_for
    from tests.k8s_fake_cluster import FakeCluster

    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, RUN_ID)) as cluster:
        namespace = namespace_for(config.runtime.kubernetes, "acme")
        cluster.namespaces.add(namespace)

        def new_backend() -> Backend:
            return KubernetesBackend(config, api=cluster.api())

        yield Target(kind, config, new_backend, lambda name: cluster.kill_container(namespace, name))


def _spec(target: Target, session: str) -> Any:
    config = target.config
    return spec_from_config(config, effective_agent(config, "main"), session, str(config.instance))


async def test_ensure_exists_list_remove(target: Target) -> None:
    backend = target.new_backend()
    try:
        spec = _spec(target, "agent:main:c1")
        box = await backend.ensure(spec)
        assert await backend.exists(spec.name)
        listed = [i for i in await backend.list(instance=target.config.instance) if i.name == spec.name]
        assert len(listed) == 1 and listed[0].tenant == "acme" and listed[0].scope == "session"
        assert listed[0].running and listed[0].config_hash == spec.config_hash
        again = await backend.ensure(spec)
        assert again.id == box.id  # the same sandbox, not a second one
        await backend.remove(box.id)
        assert not await backend.exists(spec.name)
        assert spec.name not in [i.name for i in await backend.list(instance=target.config.instance)]
        await backend.remove(box.id)  # removing what is gone is not an error
    finally:
        await backend.aclose()


async def test_run_env_workdir_exit_code(target: Target) -> None:
    backend = target.new_backend()
    try:
        box = await backend.ensure(_spec(target, "agent:main:c2"))
        result = await box.run(
            RunRequest(
                "mkdir -p d && cd d && pwd; echo $GREETING; echo err >&2; exit 7",
                call_id="c_run1",
                env={"GREETING": "hello"},
                workdir="/workspace",
            )
        )
        assert result.exit_code == 7
        assert result.stdout.decode().split() == ["/workspace/d", "hello"]
        assert result.stderr.decode().strip() == "err"
        direct = await box.run_argv(["id", "-u"])
        assert direct.exit_code == 0 and direct.stdout.strip().isdigit()
        await backend.remove(box.id)
    finally:
        await backend.aclose()


async def test_a_timeout_kills_the_whole_process_group(target: Target) -> None:
    backend = target.new_backend()
    try:
        box = await backend.ensure(_spec(target, "agent:main:c3"))
        result = await box.run(RunRequest("sleep 300 & sleep 300 & wait", call_id="c_slow1", timeout_s=1))
        assert result.timed_out and result.exit_code is None
        assert await box.alive("c_slow1") == []  # nothing of the call is left
        await backend.remove(box.id)
    finally:
        await backend.aclose()


async def test_kill_ends_a_running_call(target: Target) -> None:
    backend = target.new_backend()
    try:
        box = await backend.ensure(_spec(target, "agent:main:c4"))
        results: list[Any] = []

        async def long_call() -> None:
            results.append(await box.run(RunRequest("sleep 300", call_id="c_long1", timeout_s=60)))

        async with anyio.create_task_group() as group:
            group.start_soon(long_call)
            with anyio.fail_after(20):
                while not await box.alive("c_long1"):
                    await anyio.sleep(0.1)
            await box.kill("c_long1")
        assert results[0].exit_code != 0 and not results[0].timed_out
        assert await box.alive("c_long1") == []
        await backend.remove(box.id)
    finally:
        await backend.aclose()


async def test_files_through_the_tools(target: Target) -> None:
    async with Orchestrator(target.config, target.new_backend(), journal=False) as orch:
        session = orch.session(agent="main", key="agent:main:c5")
        wrote = await session.call("write", {"path": "a/b.txt", "content": "one\ntwo\n"})
        assert wrote.ok, wrote.error
        edited = await session.call("edit", {"path": "a/b.txt", "old_string": "two", "new_string": "three"})
        assert edited.ok, edited.error
        read = await session.call("read", {"path": "a/b.txt"})
        assert read.ok and "three" in str(read.output), read.error
        seen = await session.call("exec", {"command": "cat a/b.txt"})
        assert seen.output["output"] == "one\nthree\n"
        escape = await session.call("read", {"path": "../../etc/passwd"})
        assert not escape.ok and escape.error.code == "PERMISSION_DENIED"
        await session.call("exec", {"command": "ln -s /etc/passwd leak"})
        leak = await session.call("read", {"path": "leak"})
        assert not leak.ok and leak.error.code == "PERMISSION_DENIED"
        await session.close()


async def test_a_sandbox_gone_behind_the_backend_is_made_again(target: Target) -> None:
    async with Orchestrator(target.config, target.new_backend(), journal=False) as orch:
        session = orch.session(agent="main", key="agent:main:c6")
        first = await session.call("exec", {"command": "echo up"})
        assert first.ok, first.error
        box = await session.sandbox_required()
        await anyio.to_thread.run_sync(target.remove_behind, box.id)
        again = await session.call("exec", {"command": "echo again"})
        if not again.ok:  # the call that found it gone may fail retryably; the next one works
            assert again.error.retryable, again.error
            again = await session.call("exec", {"command": "echo again"})
        assert again.ok and again.output["output"] == "again\n", again.error
        await session.close()


async def test_a_new_process_adopts_the_running_sandbox(target: Target) -> None:
    spec = _spec(target, "agent:main:c7")
    first = target.new_backend()
    try:
        box = await first.ensure(spec)
        await box.run(RunRequest("echo kept > /workspace/mark", call_id="c_mark1"))
    finally:
        await first.aclose()
    second = target.new_backend()  # a restarted orchestrator
    try:
        adopted = await second.ensure(spec)
        assert adopted.id == box.id
        kept = await adopted.run(RunRequest("cat /workspace/mark", call_id="c_mark2"))
        assert kept.stdout == b"kept\n"  # the same sandbox, its files still there
        await second.remove(adopted.id)
    finally:
        await second.aclose()


async def test_a_skill_call_gets_only_what_it_declares(target: Target) -> None:
    """A skill call runs in a sandbox of its own (a container, a Pod) that holds its folder and
    only the declared path, read-only; a link the session planted inside that path leads nowhere
    (Docker: not followed out of the bind; a cluster: the kubelet's subPath is the folder only),
    and nothing of the call's sandbox is left."""
    async with Orchestrator(target.config, target.new_backend(), journal=False) as orch:
        session = orch.session(agent="skilled", key="agent:skilled:c8")
        made = await session.call(
            "exec",
            {
                "command": "mkdir -p public && printf hello > public/note.txt && echo TOP > secret.txt && ln -s .. public/up"
            },
        )
        assert made.ok, made.error
        ran = await session.call("peek", {})
        assert ran.ok, ran.error
        out = ran.output
        assert out["listing"] == ["public"] and out["home"] == ["SKILL.md", "handler.py"]
        assert out["/workspace/public/note.txt"] == "hello"
        assert out["/workspace/secret.txt"] == "FileNotFoundError"
        assert out["/workspace/public/up/secret.txt"] == "FileNotFoundError"  # `..` is the skill's own /workspace
        assert out["planted"] in ("OSError", "PermissionError")
        kinds = [info.kind for info in await orch.backend.list(instance=target.config.instance)]
        assert "skill" not in kinds
        await session.close()
